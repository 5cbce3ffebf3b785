"""What every async face of a store is (:class:`AsyncBackend`), and how a call is made to its end.

Apart from :mod:`uniqjob.stores.aio`, which picks each store's face: a store's own
face (the Redis store's) builds on this module without importing the module that
imports it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from ..errors import CorruptRecordError
from ..locks import LockState, QueueMeta, RunClaim
from .base import Backend, QueueMode

__all__ = ["AsyncBackend", "completed", "in_thread"]

T = TypeVar("T")


class AsyncBackend:
    """Awaits the primitives of ``sync`` (see :class:`~uniqjob.stores.base.Backend` for each).

    One ``async def`` per primitive, with the sync one's name and parameters. Here each awaits
    :meth:`call`: a temporary bridge for a face that still answers by name (Redis's, until it
    has these methods of its own); :class:`DirectAsync` and :class:`ThreadAsync` override them.
    """

    def __init__(self, sync: Backend) -> None:
        #: The sync backend this one acts on: the same store and records.
        self.sync = sync

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Await primitive ``name`` of the contract with these arguments; its answer."""
        raise NotImplementedError

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
    ) -> LockState | None:
        """:meth:`Backend.claim <uniqjob.stores.base.Backend.claim>`, awaited."""
        kwargs = {"meta": meta, "ttl": ttl, "run": run, "count": count, "counted": counted}
        answer: LockState | None = await self.call("claim", (key, token), kwargs)  # bridge
        return answer

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
        """:meth:`Backend.start <uniqjob.stores.base.Backend.start>`, awaited."""
        kwargs = {
            "run": run,
            "meta": meta,
            "ttl": ttl,
            "adopt": adopt,
            "queue_lock": queue_lock,
            "count": count,
            "counted": counted,
        }
        answer: LockState | None = await self.call("start", (key, token), kwargs)  # bridge
        return answer

    async def attach(self, key: str, token: str, job_id: str) -> bool:
        """:meth:`Backend.attach <uniqjob.stores.base.Backend.attach>`, awaited."""
        return bool(await self.call("attach", (key, token, job_id), {}))  # bridge

    async def requeue(
        self, key: str, token: str, *, meta: QueueMeta, ttl: float | None, attempt: str = ""
    ) -> bool:
        """:meth:`Backend.requeue <uniqjob.stores.base.Backend.requeue>`, awaited."""
        kwargs = {"meta": meta, "ttl": ttl, "attempt": attempt}
        return bool(await self.call("requeue", (key, token), kwargs))  # bridge

    async def renew(self, key: str, token: str, lease: float, attempt: str = "") -> bool:
        """:meth:`Backend.renew <uniqjob.stores.base.Backend.renew>`, awaited."""
        return bool(await self.call("renew", (key, token, lease, attempt), {}))  # bridge

    async def finish(self, key: str, token: str, *, keep_queue: bool = False, attempt: str = "") -> None:
        """:meth:`Backend.finish <uniqjob.stores.base.Backend.finish>`, awaited."""
        await self.call("finish", (key, token), {"keep_queue": keep_queue, "attempt": attempt})  # bridge

    async def dequeue(self, key: str, token: str | None = None) -> bool:
        """:meth:`Backend.dequeue <uniqjob.stores.base.Backend.dequeue>`, awaited."""
        return bool(await self.call("dequeue", (key, token), {}))  # bridge

    async def reclaim(self, key: str, queue_token: str | None, run_token: str | None) -> bool:
        """:meth:`Backend.reclaim <uniqjob.stores.base.Backend.reclaim>`, awaited."""
        return bool(await self.call("reclaim", (key, queue_token, run_token), {}))  # bridge

    async def read(self, key: str) -> LockState:
        """:meth:`Backend.read <uniqjob.stores.base.Backend.read>`, awaited."""
        answer: LockState = await self.call("read", (key,), {})  # bridge
        return answer

    async def read_many(self, keys: Sequence[str]) -> list[LockState | CorruptRecordError]:
        """:meth:`Backend.read_many <uniqjob.stores.base.Backend.read_many>`, awaited."""
        answer: list[LockState | CorruptRecordError] = await in_thread(self.sync.read_many, keys)
        return answer  # bridge: in a thread (a face answering by name has no batch)

    async def aclose(self) -> None:
        """Close what this object holds of its own (the sync backend is closed on its own)."""


async def in_thread(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``await asyncio.to_thread(function, ...)``, made even if the task is cancelled meanwhile.

    A cancelled ``to_thread`` drops a call still waiting for a worker thread, and one
    already running goes on: a release dropped would leave its lock or slot for a lease,
    an acquire going on could land after the undo that follows. So the call is always
    made, and the cancellation is raised once it has ended (what it took is then undone).
    """
    return await completed(asyncio.to_thread(function, *args, **kwargs))


async def completed(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end even if the task is cancelled meanwhile; then raise the cancellation.

    However often it is cancelled: anyio's cancel scopes (Starlette, FastAPI) cancel
    every await inside them again until the scope exits, so a single shield would not do.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the cancellation is the news, not a failure of the call
        raise cancelled
    return task.result()
