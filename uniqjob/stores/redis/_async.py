"""RedisAsync: the Redis store's primitives awaited through ``redis.asyncio`` (or ``valkey.asyncio``).

Each primitive is a typed coroutine of the same name and signature as the sync
store's (``await face.claim(key, token, meta=...)``). It sends the very script
call the sync store makes (its ``_<name>_call``: the same script, keys and
arguments) with the async client's ``evalsha`` (the script loaded again on a
``NOSCRIPT`` reply) and reads the reply with the same reader: one round trip
per primitive here too. With ``replicas=N`` a grant goes with ``WAIT`` behind
it in one pipeline and is judged by the sync store's rules (``_acks``); on a
cluster client such a grant is the sync store's own, in a thread (``WAIT``
must go on the connection to the slot's primary, which the async cluster
client does not hand out).

The async client is made from the sync client's settings, one per event loop
(an asyncio connection belongs to the loop that opened it): ``_client.maker``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any, TypeVar

from redis.commands.core import Script

from ...errors import CorruptRecordError
from ...locks import LockState, PendingCall, QueueMeta, RunClaim
from .._async_base import AsyncBackend, in_thread
from ..base import Backend, Coalesce, Debounce, QueueMode
from ._acks import check_wait
from ._client import POOL_SIZE, is_cluster, maker
from ._store import Call, RedisBackend
from ._wire import is_noscript, judged, plain

__all__ = ["POOL_SIZE", "AsyncWire", "RedisAsync"]

T = TypeVar("T")


class AsyncWire:
    """One event loop's async client, and how a script is called on it (``_wire.Wire``'s twin).

    A pool that refuses a connection past its limit rather than waiting for one (a
    Sentinel pool, a cluster's nodes) is gated here: as many calls at once as it has
    connections; more wait their turn.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cluster = is_cluster(client)
        pool = getattr(client, "connection_pool", None)
        self._gate: AbstractAsyncContextManager[Any] = nullcontext()
        if type(pool).__name__ != "BlockingConnectionPool":  # (which waits for a connection itself)
            self._gate = asyncio.Semaphore(POOL_SIZE)

    async def call(self, script: Script, numkeys: int, items: Sequence[Any]) -> Any:
        """Run ``script`` with ``items`` (its ``numkeys`` keys, then its arguments); its reply (``plain``)."""
        client = self.client
        async with self._gate:
            try:
                return plain(await client.evalsha(script.sha, numkeys, *items))
            except Exception as exc:
                if not is_noscript(exc):
                    raise
            script.sha = await client.script_load(script.script)
            return plain(await client.evalsha(script.sha, numkeys, *items))

    async def _piped(
        self, script: Script, numkeys: int, batch: Sequence[Sequence[Any]], *tail: Any
    ) -> list[Any]:
        """``script`` once per entry of ``batch``, then the command ``tail`` if any, in one pipeline
        (``_wire.piped``'s twin): the replies, errors in their place; sent again once if the
        server lost the script."""
        for attempt in (0, 1):
            pipe = self.client.pipeline(transaction=False)
            for items in batch:
                pipe.execute_command("EVALSHA", script.sha, numkeys, *items)
            if tail:
                pipe.execute_command(*tail)
            async with self._gate:
                replies: list[Any] = await pipe.execute(raise_on_error=False)
            if attempt or not any(isinstance(r, Exception) and is_noscript(r) for r in replies):
                return replies
            script.sha = await self.client.script_load(script.script)
        raise AssertionError("unreachable")  # pragma: no cover

    async def many(self, script: Script, numkeys: int, batch: Sequence[Sequence[Any]]) -> list[Any]:
        """``script`` once per entry of ``batch``, in one pipeline: as ``_wire.Wire.many`` does."""
        if not batch:
            return []
        return [plain(reply) for reply in await self._piped(script, numkeys, batch)]

    async def acked(
        self, script: Script, numkeys: int, items: Sequence[Any], wait: tuple[int, int]
    ) -> tuple[Any, int | Exception]:
        """``EVALSHA`` then ``WAIT`` in one pipeline (one server): as ``_wire.piped`` does."""
        return judged(*(await self._piped(script, numkeys, [items], "WAIT", *wait)))

    async def connected_replicas(self) -> int | None:
        """How many replicas the server has connected; None if it cannot be told."""
        try:
            return int((await self.client.info("replication"))["connected_slaves"])
        except Exception:  # only for a message: the call fails with its own error
            return None


class RedisAsync(AsyncBackend):
    """Awaits a :class:`RedisBackend`'s primitives on an async client to the same server or cluster."""

    sync: RedisBackend

    def __init__(self, sync: Backend) -> None:
        assert isinstance(sync, RedisBackend)
        super().__init__(sync)
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncWire] = (
            weakref.WeakKeyDictionary()
        )
        self._make = maker(sync.client)  # a client with no async twin fails here, at first use

    def wire(self) -> AsyncWire:
        """The running event loop's wire (its client made on the loop's first call)."""
        loop = asyncio.get_running_loop()
        mine = self._loops.get(loop)
        if mine is None:
            made = self._make()
            if self.sync.replicas:  # the sync store's check, on the client the grants go through here
                check_wait(made, self.sync.replica_timeout)
            mine = self._loops[loop] = AsyncWire(made)
        return mine

    # -- the primitives: each the sync store's call, awaited -------------------------------------

    async def claim(
        self,
        key: str,
        token: str,
        *,
        meta: QueueMeta,
        ttl: float | None = None,
        run: RunClaim | None = None,
        count: bool = False,
        counted: float | None = None,
        coalesce: Coalesce = "",
        debounce: Debounce | None = None,
    ) -> LockState | None:
        call = self.sync._claim_call(
            key, token, meta=meta, ttl=ttl, run=run, count=count, counted=counted, coalesce=coalesce,
            debounce=debounce,
        )  # fmt: skip
        return await self._done(call)

    async def start(
        self,
        key: str,
        token: str,
        *,
        run: RunClaim,
        meta: QueueMeta,
        ttl: float | None = None,
        adopt: bool = False,
        queue_lock: QueueMode = "run",
        count: bool = False,
        counted: float | None = None,
    ) -> LockState | None:
        call = self.sync._start_call(
            key, token, run=run, meta=meta, ttl=ttl, adopt=adopt, queue_lock=queue_lock,
            count=count, counted=counted,
        )  # fmt: skip
        return await self._done(call)

    async def attach(self, key: str, token: str, job_id: str) -> bool:
        return await self._done(self.sync._attach_call(key, token, job_id))

    async def requeue(
        self, key: str, token: str, *, meta: QueueMeta, ttl: float | None, attempt: str = ""
    ) -> bool:
        return await self._done(self.sync._requeue_call(key, token, meta=meta, ttl=ttl, attempt=attempt))

    async def renew(self, key: str, token: str, lease: float, attempt: str = "") -> bool:
        return await self._done(self.sync._renew_call(key, token, lease, attempt))

    async def finish(
        self, key: str, token: str, *, keep_queue: bool = False, attempt: str = ""
    ) -> PendingCall | None:
        return await self._done(self.sync._finish_call(key, token, keep_queue=keep_queue, attempt=attempt))

    async def dequeue(self, key: str, token: str | None = None) -> bool:
        return await self._done(self.sync._dequeue_call(key, token))

    async def reclaim(self, key: str, queue_token: str | None, run_token: str | None) -> bool:
        return await self._done(self.sync._reclaim_call(key, queue_token, run_token))

    async def read(self, key: str) -> LockState:
        return await self._done(self.sync._read_call(key))

    async def read_many(self, keys: Sequence[str]) -> list[LockState | CorruptRecordError]:
        """:meth:`RedisBackend.read_many`, awaited: the READ calls ``read`` makes, in one pipeline."""
        sync = self.sync
        if getattr(sync.read, "__func__", None) is not RedisBackend.read:  # a read of its own: honoured
            states: list[LockState | CorruptRecordError] = await in_thread(sync.read_many, keys)
            return states
        calls = [sync._read_call(key) for key in keys]
        try:
            replies = await self.wire().many(sync._read, 3, [call.items for call in calls])  # READ: 3 keys
        except Exception as exc:
            raise sync._fail(exc) from exc
        return sync._states(calls, replies)

    # -- sending ---------------------------------------------------------------------------------

    async def _done(self, call: Call[T]) -> T:
        """Send ``call`` (acknowledged by replicas if it grants and the store asks for them); its answer."""
        sync = self.sync
        acks = sync._acks
        wire = self.wire()
        if acks is None or call.grant is None:
            try:
                reply = await wire.call(call.script, call.numkeys, call.items)
            except Exception as exc:
                raise sync._failure(exc, call.items[: call.numkeys]) from exc
            return call.decode(reply)
        if wire.cluster:  # WAIT goes on the slot owner's connection: the sync store's way, in a thread
            answer: T = await in_thread(sync._done, call)
            return answer
        try:
            reply, acked = await wire.acked(call.script, call.numkeys, call.items, acks.wait)
        except Exception as exc:
            raise sync._failure(exc, call.items[: call.numkeys]) from exc
        what = call.grant(reply)
        if what and acks.short(acked):  # the rules of Acks.confirm, each step awaited
            connected = None if isinstance(acked, Exception) else await wire.connected_replicas()
            told = acks.told(acked, what, connected)
            undo = call.undo(reply) if call.undo is not None else None
            if undo is None:
                raise acks.refused(told, sync, sync.name, undone=False)
            try:
                await self._done(undo)
            except Exception as exc:
                raise acks.refused(told, sync, sync.name, exc, undone=False) from exc
            raise acks.refused(told, sync, sync.name, undone=True)
        return call.decode(reply)

    async def ping(self) -> Any:
        """PING through this loop's client (the benchmarks' yardstick)."""
        return await self.wire().client.ping()

    async def aclose(self) -> None:
        """Close the running loop's client."""
        mine = self._loops.pop(asyncio.get_running_loop(), None)
        if mine is not None:
            await mine.client.aclose()
