"""The redis-py clients and stores a checked Redis URL (``_url.RedisURL``) describes.

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
from ._url import RedisURL

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster

    from ._store import RedisBackend

__all__ = ["backend_for", "client_for"]


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
    sentinels = Sentinel(spec.nodes, sentinel_kwargs=once)  # type: ignore[no-untyped-call]
    master: redis.Redis = sentinels.master_for(spec.service, **spec.connection)  # type: ignore[no-untyped-call]
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


def backend_for(spec: RedisURL) -> RedisBackend:
    """A new RedisBackend on the client ``spec`` describes, with its namespace and replica settings."""
    from ._store import RedisBackend

    backend = RedisBackend(
        client_for(spec),  # RedisBackend takes a cluster client too
        namespace=spec.namespace,
        timeout=spec.connection["socket_timeout"],
        replicas=spec.replicas,
        replica_timeout=spec.replica_timeout,
    )
    backend.name = spec.flavor  # "valkey" in the messages of a Valkey URL's store
    return backend
