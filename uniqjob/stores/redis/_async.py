"""RedisAsync: the Redis store's primitives awaited through ``redis.asyncio``.

Each primitive sends the very script call the sync store makes
(:meth:`RedisBackend.call`: the same scripts, keys and arguments, packed by
the same ``_transport`` functions) and reads its reply with the same reader,
so the two paths differ only in how the bytes travel: one round trip per
primitive here too. The async client is built
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
from ._client import where
from ._store import RedisBackend
from ._transport import evalsha_head, pack, pack_after

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
            f"the asyncio API takes a plain redis://, rediss:// or unix:// client; {where(client)} "
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


class _Loop:
    """One event loop's async client, and the connections taken from its pool that are kept, idle.

    A call takes an idle kept connection (a list pop) rather than going through the
    pool's lock and condition each time; the pool still bounds how many there are.
    """

    def __init__(self, client: aredis.Redis) -> None:
        self.client = client
        self.idle: list[Any] = []
        self.waiting = 0  # calls waiting for the pool to give them a connection

    async def exchange(self, command: bytes) -> Any:
        """Send one packed command on a kept connection and read its reply.

        A connection whose exchange did not end (an error on the wire, a cancelled
        task) goes back to the pool closed, never to the next caller mid-reply.
        """
        pool = self.client.connection_pool
        if self.idle:
            conn = self.idle.pop()
        else:
            self.waiting += 1
            try:
                conn = await pool.get_connection(*_NAMED)  # type: ignore[no-untyped-call]
            finally:
                self.waiting -= 1
        try:
            await conn.send_packed_command(command, check_health=False)
            reply = await conn.read_response()
        except redis.ResponseError:
            await self._done(conn)  # the server answered: the connection is in step
            raise
        except BaseException:
            await conn.disconnect()
            await pool.release(conn)
            raise
        await self._done(conn)
        return reply

    async def _done(self, conn: Any) -> None:
        """Keep ``conn`` idle, or hand it back to the pool while other calls wait for one there."""
        if self.waiting:
            await self.client.connection_pool.release(conn)
        else:
            self.idle.append(conn)

    async def aclose(self) -> None:
        pool = self.client.connection_pool
        for conn in self.idle:
            await pool.release(conn)
        self.idle = []
        await self.client.aclose()


class RedisAsync(AsyncBackend):
    """Awaits a :class:`RedisBackend`'s primitives on an async client to the same server.

    Each script call is packed as the sync store packs it (``_transport``) and sent
    on a connection this loop keeps.
    """

    sync: RedisBackend

    def __init__(self, sync: Backend) -> None:
        assert isinstance(sync, RedisBackend)
        if sync.replicas:  # never a grant the replicas were not asked to acknowledge
            raise ConfigurationError(
                f"replica acknowledgement (replicas={sync.replicas}) is not available through the asyncio "
                "API yet: use the sync API for this store, or replicas=0"
            )
        super().__init__(sync)
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Loop] = weakref.WeakKeyDictionary()
        async_client_of(sync.client)  # a client with no async twin fails here, at first use
        settings = sync.client.connection_pool.connection_kwargs
        self._encoding = (settings.get("encoding", "utf-8"), settings.get("encoding_errors", "strict"))
        self._heads: dict[tuple[str, int, int], bytes] = {}

    def _loop(self) -> _Loop:
        loop = asyncio.get_running_loop()
        mine = self._loops.get(loop)
        if mine is None:
            mine = self._loops[loop] = _Loop(async_client_of(self.sync.client))
        return mine

    def client(self) -> aredis.Redis:
        """The async client of the running event loop (made on its first call)."""
        return self._loop().client

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call = self.sync.call(name, *args, **kwargs)
        try:
            reply = await self.evalsha(call.script, call.numkeys, call.items)
        except Exception as exc:
            raise self.sync._failure(exc, call.items[: call.numkeys]) from exc
        return call.decode(reply)

    async def evalsha(self, script: Any, numkeys: int, items: list[Any]) -> Any:
        """Send ``script`` (a registered redis-py Script) with ``items`` on a kept connection; its raw reply.

        The concurrency slots' async store (``_async_semaphores``) sends its scripts through this too.
        """
        loop = self._loop()
        command = pack_after(self._head(script.sha, numkeys, len(items)), items, *self._encoding)
        try:
            return await loop.exchange(command)
        except NoScriptError:  # a restarted or flushed server: load it, once, and send again
            await loop.client.script_load(script.script)
            return await loop.exchange(command)

    def _head(self, sha: str, numkeys: int, count: int) -> bytes:
        head = self._heads.get((sha, numkeys, count))
        if head is None:
            head = self._heads[(sha, numkeys, count)] = evalsha_head(sha, numkeys, count)
        return head

    async def ping(self) -> Any:
        """PING through this loop's client (the benchmarks' yardstick)."""
        return await self.client().ping()

    async def kept_ping(self) -> Any:
        """PING on one of this loop's kept connections, as the script calls go."""
        return await self._loop().exchange(_PING)

    async def aclose(self) -> None:
        """Close the running loop's client and its kept connections."""
        mine = self._loops.pop(asyncio.get_running_loop(), None)
        if mine is not None:
            await mine.aclose()


_PING = pack(["PING"])
# What get_connection() is given: nothing since redis-py 5.3 (which deprecates the command name).
_NAMED: tuple[str, ...] = () if tuple(redis.VERSION) >= (5, 3) else ("EVALSHA",)
