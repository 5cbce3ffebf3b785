"""The clients of both Redis stores: made from a URL, described, their errors told apart.

A client is a redis-py ``Redis`` (on a plain, blocking or Sentinel pool), a
``RedisCluster``, or valkey-py's ``Valkey`` / ``ValkeyCluster``, which are
redis-py's forks with exception classes of their own. This module:

- makes the client a checked URL (``_url.RedisURL``) describes (:func:`client_for`):
  one server on a plain pool of the scheme's connections, a cluster seeded from
  the URL's nodes, or a Sentinel service's ``master_for`` client (which asks the
  Sentinels for the master on each new connection); Valkey URLs use the same
  clients, Valkey speaking the same protocol;
- makes the asyncio twin of a sync client (:func:`maker`), from the sync client's
  own settings, read through its public attributes (``connection_pool.connection_kwargs``,
  ``nodes_manager``, ...);
- describes a client for messages (:func:`where`): its server and database,
  the Sentinel service and its Sentinels, or a cluster's nodes; never raises;
- tells the client library's own errors from anything else (:func:`is_client_error`,
  :func:`is_response_error`), whichever library raised them, and words a URL's mistake
  (no password, a wrong one, no such database) as its fix (:func:`backend_error`);
- names the Redis keys of a user's key so that all of them share one
  cluster slot, and reads the key back from a name (:func:`names`, :func:`key_of`).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import sys
import zlib
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel

from ...errors import BackendError, ConfigurationError, StoreRefusedURLError
from .._urls import bad
from ._url import RedisURL, parse

if TYPE_CHECKING:
    #: A client the stores take: redis-py's, on one server or a cluster (valkey-py's are alike, untyped).
    Client: TypeAlias = redis.Redis | RedisCluster

__all__ = [
    "NEEDS_PASSWORD",
    "NO_SUCH_DB",
    "POOL_SIZE",
    "WRONG_PASSWORD",
    "Client",
    "backend_error",
    "client_for",
    "is_client_error",
    "is_cluster",
    "is_response_error",
    "key_of",
    "maker",
    "names",
    "redis_client_from_url",
    "where",
]


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
    quiet = {**spec.connection, **_QUIET}
    if spec.topology == "cluster":
        return _cluster(spec, quiet)
    if spec.topology == "sentinel":
        return _sentinel(spec, quiet)
    return _server(spec, quiet)


def _unnamed() -> dict[str, Any]:
    """The client settings that send no ``CLIENT SETINFO``, in the installed redis-py's words."""
    try:  # redis-py's DriverInfo, which deprecated lib_name= and lib_version=
        return {"driver_info": redis.DriverInfo(name=None, lib_version=None)}
    except (AttributeError, TypeError):  # a redis-py from before it
        return {"lib_name": None, "lib_version": None}


#: How every client made from a URL talks: RESP2, and no ``CLIENT SETINFO``, so a new connection
#: sends nothing before its first command (redis-py's defaults cost up to four round trips:
#: ``HELLO 3``, two ``SETINFO``; a forked RQ work horse or a ``uniqjob run`` pays them each time).
#: A client given to ``configure()`` or ``RedisBackend`` keeps its own settings.
_QUIET: dict[str, Any] = {"protocol": 2, **_unnamed()}


def _server(spec: RedisURL, connection: dict[str, Any]) -> redis.Redis:
    kind: type[Connection | UnixDomainSocketConnection] = Connection
    if spec.tls:
        kind = SSLConnection
    elif "path" in spec.connection:
        kind = UnixDomainSocketConnection
    # As redis.Redis.from_url builds it: a plain pool of the scheme's connections, closed with the client.
    pool = redis.ConnectionPool(connection_class=kind, **connection)
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


def _sentinel(spec: RedisURL, connection: dict[str, Any]) -> redis.Redis:
    # Each Sentinel is asked once: the client asks the next one when one fails, and redis-py's
    # default retry (with backoff) on each would stretch a lookup far past the timeout.
    once = {**spec.sentinel, **_QUIET, "retry": Retry(NoBackoff(), 0)}
    sentinels = Sentinel(spec.nodes, sentinel_kwargs=once)  # type: ignore[no-untyped-call, unused-ignore]
    master: redis.Redis = sentinels.master_for(spec.service, **connection)  # type: ignore[no-untyped-call, unused-ignore]
    return master


def _cluster(spec: RedisURL, connection: dict[str, Any]) -> RedisCluster:
    seeds = [ClusterNode(host, port) for host, port in spec.nodes]  # type: ignore[no-untyped-call]
    try:
        return RedisCluster(startup_nodes=seeds, **connection)
    except (redis.RedisError, RedisClusterException, OSError) as exc:
        seen = ", ".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in spec.nodes)
        raise BackendError(f"cannot reach the {spec.kind} at {seen}: {exc}", spec.flavor) from exc


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

    return _Library(redis, redis.asyncio, redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)


def _refused(client: Any, why: str) -> ConfigurationError:
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
    if is_cluster(client):
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


# -- describing a client, telling its errors ---------------------------------------------


def is_cluster(client: Any) -> bool:
    return callable(getattr(client, "get_node_from_key", None))


def where(client: Any) -> str:
    """Where ``client`` talks to, for messages: never raises, whatever kind of client it is."""
    try:
        pool = getattr(client, "connection_pool", None)
        service = getattr(pool, "service_name", None)
        kwargs = getattr(pool, "connection_kwargs", None)
        db = kwargs.get("db", 0) if isinstance(kwargs, dict) else 0
        if isinstance(service, str):  # a Sentinel pool: its connections carry no host
            sentinels = getattr(getattr(pool, "sentinel_manager", None), "sentinels", ())
            return f"Sentinel service {service!r} via [{_shown(_address(s) for s in sentinels)}], db={db}"
        if isinstance(kwargs, dict):
            spot = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
            return f"{spot!r}, db={db}"
        get_nodes = getattr(client, "get_nodes", None)  # a cluster client: no one pool
        if callable(get_nodes):
            # redis-py 5 forgets its nodes and seeds when the cluster cannot be reached: the
            # node it last used (its default node) is what it still knows
            manager = client.nodes_manager
            nodes = list(get_nodes()) or list(manager.startup_nodes.values()) or [manager.default_node]
            return f"cluster [{_shown(str(getattr(node, 'name', node)) for node in nodes)}]"
        # a client of another kind that says what it is
        if type(client).__repr__ is not object.__repr__:  # type: ignore[comparison-overlap]
            return repr(client)[:120]
    except Exception:  # a description must not fail the call it describes
        pass
    return f"a {type(client).__name__} client"


def _address(client: Any) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"{kwargs.get('host')}:{kwargs.get('port')}"


def _shown(items: Any, most: int = 3) -> str:
    first = list(itertools.islice(items, most + 1))
    return ", ".join(first[:most]) + (", ..." if len(first) > most else "")


def _classes(name: str) -> tuple[type[BaseException], ...]:
    """redis-py's exception class ``name``, and valkey-py's if valkey-py is loaded (a client exists)."""
    found: list[type[BaseException]] = [getattr(redis.exceptions, name)]
    valkey = sys.modules.get("valkey.exceptions")
    if valkey is not None and hasattr(valkey, name.replace("Redis", "Valkey")):
        found.append(getattr(valkey, name.replace("Redis", "Valkey")))
    return tuple(found)


def is_client_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the client library's own error (redis-py's or valkey-py's), not a bug's."""
    # A cluster client's RedisClusterException is no RedisError.
    return isinstance(exc, _classes("RedisError") + _classes("RedisClusterException"))


NEEDS_PASSWORD = (
    "the server needs a password: put it in the URL (redis://:PASSWORD@HOST:6379/0, or ?password=...)"
)
WRONG_PASSWORD = "the server refused the user name or password in the URL: check them"
NO_SUCH_DB = "the server has no database of the URL's number (its `databases` setting; 16 by default)"
# The server's words for each mistake of a URL (RESP3's HELLO, RESP2's commands): redis-py passes
# them through, and asked for nothing but a password a server speaks of HELLO and AUTH.
_URL_MISTAKES = {
    "HELLO must be called with the client already authenticated": NEEDS_PASSWORD,
    "NOAUTH": NEEDS_PASSWORD,
    "Authentication required": NEEDS_PASSWORD,
    "WRONGPASS": WRONG_PASSWORD,
    "invalid username-password pair": WRONG_PASSWORD,
    "invalid password": WRONG_PASSWORD,
    "DB index is out of range": NO_SUCH_DB,
    "ERR DB index is out of range": NO_SUCH_DB,
}


def backend_error(exc: Exception, owner: object, store: str) -> BackendError:
    """The BackendError a caller of ``owner`` (a store) sees for ``exc``; raise it ``from exc``.

    The client library's own error keeps its text; anything else (a bug in a wire
    path, a client of an unknown kind) is named by its class too.
    """
    if isinstance(exc, BackendError):
        return exc
    text = str(exc) or type(exc).__name__
    if not is_client_error(exc):
        text = f"{type(exc).__name__}: {text}"
    else:
        for start, mistake in _URL_MISTAKES.items():
            if text.startswith(start):
                return StoreRefusedURLError(f"{mistake} ({owner!r})", store)
    return BackendError(f"{text} ({owner!r})", store)


def is_response_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an error reply of the server, as redis-py or valkey-py raises it."""
    return isinstance(exc, _classes("ResponseError"))


# -- names: one slot per key -------------------------------------------------------------
#
# A key's Redis names are ``<prefix>{<key>}:<part>``: the hash tag (the text between the
# first "{" and the next "}") is the key, or its start up to a "}" inside it, the same for
# every part, so one slot. A key that starts with "}" (or is empty) would give an empty tag,
# which Redis ignores, hashing each whole name on its own: such a key is named
# ``<prefix>~{<crc32 hex>}<key>:<part>`` instead. No ordinary name has "~{" after the
# prefix (it has "{"), so the two forms never meet, and ordinary keys keep the names they had.

_ESCAPED = "~{"


def names(prefix: str, key: str, parts: Sequence[str]) -> list[str]:
    """The Redis names of ``key``'s ``parts`` under ``prefix``, all in one cluster slot."""
    if key[:1] not in ("}", ""):
        base = f"{prefix}{{{key}}}:"
    else:
        base = f"{prefix}{_ESCAPED}{zlib.crc32(key.encode('utf-8', 'surrogateescape')):08x}}}{key}:"
    return list(map(base.__add__, parts))  # (not a comprehension: in 3.11 that is a call of its own)


def key_of(prefix: str, name: str, part: str) -> str | None:
    """The key whose ``part`` is named ``name`` (see :func:`names`); None if ``name`` is not one."""
    if not (name.startswith(prefix) and name.endswith(":" + part)):
        return None
    body = name[len(prefix) : -len(part) - 1]
    if body.startswith(_ESCAPED):
        tag_end = body.find("}", len(_ESCAPED))
        return body[tag_end + 1 :] if tag_end > 0 else None
    if body.startswith("{") and body.endswith("}") and len(body) >= 3 and body[1] != "}":
        return body[1:-1]
    return None
