"""RedisAsyncSemaphores: the Redis semaphore store's primitives awaited through ``redis.asyncio``.

Each primitive is a typed coroutine of the same name and signature as the sync
store's. It is the very script call the sync store makes (its
``_<name>_call``: the same script, keys and arguments) sent on the lock
store's async client (:meth:`AsyncWire.call
<uniqjob.stores.redis._async.AsyncWire.call>`), and its reply read by the same
reader. An error reply is explained as the sync store explains it (a corrupt
record by name), in a thread: explaining may ask the server which structure
holds the wrong type. With ``replicas`` > 0 each primitive is the sync
store's own, in a thread (its WAIT and undo rules).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TypeVar

from ...locks import Holder
from .._async_base import in_thread
from ..semaphores import HANDOFF, Outcome, Park, SemaphoreState
from ..semaphores_aio import AsyncSemaphores
from ._async import RedisAsync
from ._semaphores import _PARTS, RedisSemaphores, SemCall

__all__ = ["RedisAsyncSemaphores"]

T = TypeVar("T")


class RedisAsyncSemaphores(AsyncSemaphores):
    """Awaits ``store``'s primitives on ``face``, the async face of the lock store on the same client."""

    def __init__(self, store: RedisSemaphores, face: RedisAsync) -> None:
        super().__init__(store)
        self.store = store
        self.face = face

    async def _done(self, call: SemCall[T]) -> T:
        store = self.store
        if store._acks is not None:  # replicas > 0: the sync store's acknowledged grants, in a thread
            answer: T = await in_thread(store._done, call)
            return answer
        try:
            reply = await self.face.wire().call(
                call.script, len(_PARTS), [*store._keys(call.key), *call.argv]
            )
        except Exception as exc:
            raise (await asyncio.to_thread(store._explain, call.key, exc)) from exc
        return store.decoded(call, reply)

    async def acquire(
        self,
        key: str,
        token: str,
        *,
        limit: int,
        lease: float,
        running: bool,
        holder: Holder | None,
        park: Park | None,
        job_class: str,
        args: str,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> Outcome:
        return await self._done(self.store._acquire_call(
            key, token, limit=limit, lease=lease, running=running, holder=holder, park=park,
            job_class=job_class, args=args, caller=caller, handoff=handoff,
        ))  # fmt: skip

    async def start(
        self,
        key: str,
        token: str,
        *,
        holder: Holder,
        lease: float,
        takeover: Holder | None,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> Outcome:
        return await self._done(self.store._start_call(
            key, token, holder=holder, lease=lease, takeover=takeover, caller=caller, handoff=handoff
        ))  # fmt: skip

    async def renew(
        self, key: str, token: str, lease: float, *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        return await self._done(self.store._renew_call(key, token, lease, caller=caller, handoff=handoff))

    async def release(self, key: str, token: str, *, caller: Holder, handoff: float = HANDOFF) -> Outcome:
        return await self._done(self.store._release_call(key, token, caller=caller, handoff=handoff))

    async def requeue(
        self,
        key: str,
        token: str,
        lease: float,
        *,
        holder: Holder,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> Outcome:
        return await self._done(
            self.store._requeue_call(key, token, lease, holder=holder, caller=caller, handoff=handoff)
        )

    async def handed(self, key: str, token: str, promoter: Holder) -> bool:
        return await self._done(self.store._handed_call(key, token, promoter))

    async def withdraw(self, key: str, token: str) -> Outcome:
        return await self._done(self.store._withdraw_call(key, token))

    async def reap(
        self, key: str, dead: Sequence[tuple[str, Holder]], *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        return await self._done(self.store._reap_call(key, dead, caller=caller, handoff=handoff))

    async def discard_parked(self, key: str) -> list[tuple[str, str]]:
        return await self._done(self.store._discard_parked_call(key))

    async def drop(
        self, key: str, tokens: Sequence[str], *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        return await self._done(self.store._drop_call(key, tokens, caller=caller, handoff=handoff))

    async def read(self, key: str, *, head: int = 5) -> SemaphoreState:
        return await self._done(self.store._read_call(key, head=head))
