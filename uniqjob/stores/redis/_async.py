"""RedisAsync: the Redis store's primitives awaited through ``redis.asyncio``.

Each primitive sends the very script call the sync store makes
(:meth:`RedisBackend.call`: the same scripts, keys and arguments) and reads
its reply with the same reader, so the two paths differ only in how the bytes
travel: one round trip per primitive here too. The async client is built
from the sync client's own connection settings (host or socket path, db,
password, TLS, timeouts, ``decode_responses``), one per event loop (a
``redis.asyncio`` connection belongs to the loop that opened it).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import redis
import redis.asyncio as aredis
from redis.exceptions import NoScriptError

from ...errors import ConfigurationError
from ..aio import AsyncBackend
from ..base import Backend
from ._store import RedisBackend, _where

__all__ = ["POOL_SIZE", "RedisAsync", "async_client_of"]

#: Connections an event loop's async client opens at most (or the sync pool's own limit, if lower);
#: more calls at once wait their turn for one, as long as the socket timeout allows.
POOL_SIZE = 64

# The sync connection classes and their asyncio twins (redis-py's own).
_CONNECTIONS: dict[type[Any], type[Any]] = {
    redis.Connection: aredis.Connection,
    redis.SSLConnection: aredis.SSLConnection,
    redis.UnixDomainSocketConnection: aredis.UnixDomainSocketConnection,
}


def async_client_of(client: Any) -> aredis.Redis:
    """A ``redis.asyncio`` client to the server ``client`` (a sync redis-py client) talks to, as it does.

    :class:`ConfigurationError` for a client of another kind (a cluster or
    sentinel client, a pool of a class of its own).
    """
    pool = getattr(client, "connection_pool", None)
    kind = getattr(pool, "connection_class", None)
    twin = _CONNECTIONS.get(kind) if isinstance(kind, type) else None
    if twin is None or type(pool) is not redis.ConnectionPool:
        raise ConfigurationError(
            f"the asyncio API takes a plain redis://, rediss:// or unix:// client; {_where(client)} "
            f"({type(client).__name__}, {type(pool).__name__}) has no asyncio counterpart here"
        )
    settings = dict(pool.connection_kwargs)
    size = min(POOL_SIZE, pool.max_connections)
    wait = settings.get("socket_timeout")
    return aredis.Redis(
        connection_pool=aredis.BlockingConnectionPool(
            connection_class=twin, max_connections=size, timeout=wait, **settings
        )
    )


class RedisAsync(AsyncBackend):
    """Awaits a :class:`RedisBackend`'s primitives on an async client to the same server."""

    sync: RedisBackend

    def __init__(self, sync: Backend) -> None:
        assert isinstance(sync, RedisBackend)
        super().__init__(sync)
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aredis.Redis] = (
            weakref.WeakKeyDictionary()
        )
        async_client_of(sync.client)  # a client with no async twin fails here, at first use

    def client(self) -> aredis.Redis:
        """The async client of the running event loop (made on its first call)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = async_client_of(self.sync.client)
        return client

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call = self.sync.call(name, *args, **kwargs)
        script, numkeys, items = call.script, call.numkeys, call.items
        client = self.client()
        try:
            try:
                reply = await client.evalsha(script.sha, numkeys, *items)
            except NoScriptError:  # a restarted or flushed server: load it, once, and send again
                await client.script_load(script.script)
                reply = await client.evalsha(script.sha, numkeys, *items)
        except Exception as exc:
            raise self.sync._failure(exc, items[:numkeys]) from exc
        return call.decode(reply)

    async def ping(self) -> Any:
        """PING on this loop's client (the benchmarks' yardstick)."""
        return await self.client().ping()

    async def aclose(self) -> None:
        """Close the running loop's client."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()
