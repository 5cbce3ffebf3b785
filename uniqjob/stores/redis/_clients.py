"""The redis-py clients a checked Redis URL (``_url.RedisURL``) describes.

One server is a ``redis.Redis`` on a plain pool of the scheme's connections;
a cluster a ``redis.cluster.RedisCluster`` seeded from the URL's nodes; a
Sentinel service the ``master_for`` client of a ``redis.sentinel.Sentinel``,
which asks the Sentinels for the master on each new connection. Valkey URLs
use the same clients: Valkey speaks the same protocol.

redis-py is imported when a client is made, never when this module loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import BackendError
from .._urls import bad
from ._url import RedisURL, parse

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster

__all__ = ["client_for", "redis_client_from_url"]


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
