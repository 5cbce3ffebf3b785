"""The redis-py clients a checked Redis URL (``_url.RedisURL``) describes.

One server is a ``redis.Redis`` on a plain pool of the scheme's connections;
a cluster a ``redis.cluster.RedisCluster`` seeded from the URL's nodes; a
Sentinel service the ``master_for`` client of a ``redis.sentinel.Sentinel``,
which asks the Sentinels for the master on each new connection. Valkey URLs
use the same clients: Valkey speaks the same protocol.

redis-py is imported when a client is made, never when this module loads.

:func:`maker` makes the asyncio twin of a sync client (redis-py's, or
valkey-py's for its clients), from the sync client's own settings (host or
socket path, db, password, TLS, timeouts, protocol, ``decode_responses``),
read through the clients' public attributes (``connection_pool.connection_kwargs``,
``nodes_manager``, ...): one server on a plain pool, a Sentinel service's
``master_for`` client (which follows a failover), or a cluster client.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from ...errors import BackendError, ConfigurationError
from .._urls import bad
from ._url import RedisURL, parse

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster

__all__ = ["POOL_SIZE", "client_for", "maker", "redis_client_from_url"]


def redis_client_from_url(url: str, *, timeout: float) -> redis.Redis:
    """Return a redis-py client for a URL of one server or a Sentinel service, checked first.

    The forms: ``redis://``, ``rediss://``, ``unix://``, ``valkey://``,
    ``valkeys://`` and their ``+sentinel`` forms (a ``+cluster`` URL makes a
    cluster client: use :func:`uniqjob.stores.from_url`). Both socket timeouts
    default to ``timeout`` seconds, so a call to an unreachable server fails in
    bounded time. The URL may carry the query options of
    :data:`REDIS_URL_OPTIONS` that set connections (``namespace``,
    ``replicas`` and ``replica_timeout`` set the store, and are refused here).
    Anything malformed (a bad host, port or database, an unknown option or a
    bad value, a unix URL with no socket path, a NUL byte) is a
    :class:`ConfigurationError` naming it, with any password in the URL
    masked. Nothing connects yet.
    """
    spec = parse(url, timeout=timeout)
    if spec.topology == "cluster":
        raise bad(spec.kind, url, "a cluster URL makes a cluster client: use uniqjob.stores.from_url(url)")
    for name in spec.store_options:
        raise bad(spec.kind, url, f"option {name!r} sets the store, not the client: "
                  f"pass the URL to uniqjob.stores.from_url, or {name}= to RedisBackend")  # fmt: skip
    return client_for(spec)  # type: ignore[return-value]  # not a cluster: a redis.Redis


def client_for(spec: RedisURL) -> redis.Redis | RedisCluster:
    """A new client for what ``spec`` describes.

    Only a cluster client connects now (redis-py's ``RedisCluster`` reads the
    slot map from a seed node as it is made); if no seed answers, that is a
    :class:`BackendError` naming the seeds, after at most the connect (or
    reply) timeout per seed.
    """
    if spec.topology == "cluster":
        return _cluster(spec)
    if spec.topology == "sentinel":
        return _sentinel(spec)
    return _server(spec)


def _server(spec: RedisURL) -> redis.Redis:
    import redis  # here: a process whose locks are in files never loads redis
    from redis.connection import Connection, SSLConnection, UnixDomainSocketConnection

    kind: type[Connection | UnixDomainSocketConnection] = Connection
    if spec.tls:
        kind = SSLConnection
    elif "path" in spec.connection:
        kind = UnixDomainSocketConnection
    # As redis.Redis.from_url builds it: a plain pool of the scheme's connections, closed with the client.
    pool = redis.ConnectionPool(connection_class=kind, **spec.connection)
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


def _sentinel(spec: RedisURL) -> redis.Redis:
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    from redis.sentinel import Sentinel

    # Each Sentinel is asked once: the client asks the next one when one fails, and redis-py's
    # default retry (with backoff) on each would stretch a lookup far past the timeout.
    once = {**spec.sentinel, "retry": Retry(NoBackoff(), 0)}
    sentinels = Sentinel(spec.nodes, sentinel_kwargs=once)  # type: ignore[no-untyped-call, unused-ignore]
    master: redis.Redis = sentinels.master_for(spec.service, **spec.connection)  # type: ignore[no-untyped-call, unused-ignore]
    return master


def _cluster(spec: RedisURL) -> RedisCluster:
    import redis
    from redis.cluster import ClusterNode, RedisCluster
    from redis.exceptions import RedisClusterException

    seeds = [ClusterNode(host, port) for host, port in spec.nodes]  # type: ignore[no-untyped-call]
    try:
        return RedisCluster(startup_nodes=seeds, **spec.connection)
    except (redis.RedisError, RedisClusterException, OSError) as exc:
        names = ", ".join(_name(host, port) for host, port in spec.nodes)
        raise BackendError(f"cannot reach the {spec.kind} at {names}: {exc}", spec.flavor) from exc


def _name(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


#: Connections an event loop's async client opens at most (or the sync pool's own limit, if lower);
#: more calls at once wait their turn for one, as long as the socket timeout allows.
POOL_SIZE = 64

# The sync pools' connection classes that have an asyncio twin of the same name (redis-py's, valkey-py's).
_PLAIN = ("Connection", "SSLConnection", "UnixDomainSocketConnection")
_SENTINEL = ("SentinelManagedConnection", "SentinelManagedSSLConnection")

# Settings a sync pool holds for its own use (its handlers, a proxy of itself): never handed on.
_OWN = frozenset({
    "connection_pool", "redis_connect_func", "maint_notifications_pool_handler",
    "oss_cluster_maint_notifications_handler", "himport_registry", "connection_class",
})  # fmt: skip


class _Library(NamedTuple):
    """A client library's sync and asyncio packages, and its asyncio client classes."""

    sync: Any  # redis / valkey
    aio: Any  # redis.asyncio / valkey.asyncio
    client: Any  # redis.asyncio.Redis / valkey.asyncio.Valkey
    cluster: Any  # their RedisCluster / ValkeyCluster


def _library(client: Any) -> _Library:
    """The library of ``client``: redis-py's, or valkey-py's for its clients."""
    if type(client).__module__.partition(".")[0] == "valkey":
        import valkey
        import valkey.asyncio
        import valkey.asyncio.cluster
        import valkey.asyncio.retry
        import valkey.asyncio.sentinel
        import valkey.backoff
        import valkey.sentinel

        return _Library(valkey, valkey.asyncio, valkey.asyncio.Valkey, valkey.asyncio.cluster.ValkeyCluster)
    import redis.asyncio.cluster
    import redis.asyncio.retry
    import redis.asyncio.sentinel
    import redis.backoff
    import redis.sentinel

    return _Library(redis, redis.asyncio, redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)


def _refused(client: Any, why: str) -> ConfigurationError:
    from ._client import where  # (it loads redis-py)

    return ConfigurationError(
        f"the asyncio API takes a plain redis://, rediss:// or unix:// client, a cluster client or a "
        f"Sentinel master_for client; {where(client)} ({type(client).__name__}) {why}"
    )


def _settings(kwargs: dict[str, Any], twin: type[Any], lib: _Library) -> dict[str, Any]:
    """``kwargs`` of a sync connection (or client) that ``twin``, its asyncio counterpart, takes.

    A retry policy is made again as the asyncio one, with as many tries (``get_retries()``)
    and the library's default backoff: a policy's backoff is not part of its public API.
    A library whose policy does not tell its tries (valkey-py) leaves the asyncio default.
    """
    taken: set[str] = set()
    for cls in inspect.getmro(twin):
        with contextlib.suppress(TypeError, ValueError):
            taken.update(inspect.signature(vars(cls).get("__init__", object.__init__)).parameters)
    out = {name: value for name, value in kwargs.items() if name in taken and name not in _OWN}
    retry = out.get("retry")
    if retry is not None and not isinstance(retry, lib.aio.retry.Retry):
        del out["retry"]
        tries = getattr(retry, "get_retries", None)
        if callable(tries):
            count = tries()
            backoff = lib.sync.backoff.default_backoff() if count else lib.sync.backoff.NoBackoff()
            out["retry"] = lib.aio.retry.Retry(backoff, count)
    return out


def maker(client: Any) -> Callable[[], Any]:
    """What makes an asyncio client to what ``client`` talks to, as it does (made later, in its loop).

    One server (a plain pool of the library's own connections), a Sentinel
    ``master_for`` client, or a cluster client; :class:`ConfigurationError` for
    a client of another kind (a pool or connection class of its own, a replica's).
    """
    lib = _library(client)
    if callable(getattr(client, "get_node_from_key", None)):
        return partial(_cluster_twin, client, lib)
    pool = getattr(client, "connection_pool", None)
    kind = getattr(pool, "connection_class", None)
    if isinstance(getattr(pool, "service_name", None), str):
        name = next((n for n in _SENTINEL if kind is getattr(lib.sync.sentinel, n, None)), None)
        if name is None or not getattr(pool, "is_master", False):
            raise _refused(client, "is not a Sentinel master client of the library's own connections")
        return partial(_sentinel_twin, pool, getattr(lib.aio.sentinel, name), lib)
    name = next((n for n in _PLAIN if kind is getattr(lib.sync, n, None)), None)
    if name is None or type(pool) is not lib.sync.ConnectionPool:
        shown = getattr(kind, "__name__", kind)
        raise _refused(client, f"on a {type(pool).__name__} of {shown} has no asyncio counterpart here")
    return partial(_server_twin, pool, getattr(lib.aio, name), lib)


def _server_twin(pool: Any, twin: type[Any], lib: _Library) -> Any:
    settings = _settings(pool.connection_kwargs, twin, lib)
    size = min(POOL_SIZE, pool.max_connections)
    wait = settings.get("socket_timeout")
    return lib.client(
        connection_pool=lib.aio.BlockingConnectionPool(
            connection_class=twin, max_connections=size, timeout=wait, **settings
        )
    )


def _sentinel_twin(pool: Any, twin: type[Any], lib: _Library) -> Any:
    manager = pool.sentinel_manager
    found = [s.connection_pool.connection_kwargs for s in manager.sentinels]
    sentinels = lib.aio.sentinel.Sentinel(
        [(kwargs["host"], kwargs["port"]) for kwargs in found],
        min_other_sentinels=manager.min_other_sentinels,
        sentinel_kwargs=_settings(manager.sentinel_kwargs, lib.aio.Connection, lib),
    )
    return sentinels.master_for(
        pool.service_name, redis_class=lib.client, connection_class=twin,
        check_connection=pool.check_connection, max_connections=POOL_SIZE,
        **_settings(pool.connection_kwargs, twin, lib),
    )  # fmt: skip


def _cluster_twin(client: Any, lib: _Library) -> Any:
    manager = client.nodes_manager
    kwargs = dict(manager.connection_kwargs)
    settings = _settings(kwargs, lib.cluster, lib)
    if kwargs.get("connection_class") is lib.sync.SSLConnection:  # rediss+cluster://: the nodes speak TLS
        settings["ssl"] = True
    seeds: dict[str, Any] = {}
    for node in [*manager.startup_nodes.values(), *client.get_nodes()]:
        seeds.setdefault(node.name, lib.aio.cluster.ClusterNode(node.host, node.port))
    return lib.cluster(startup_nodes=list(seeds.values()), max_connections=POOL_SIZE, **settings)
