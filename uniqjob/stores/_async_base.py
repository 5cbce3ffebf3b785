"""What every async face of a store is (:class:`AsyncBackend`), and how a call is made to its end.

Apart from :mod:`uniqjob.stores.aio`, which picks each store's face: a store's own
face (the Redis store's) builds on this module without importing the module that
imports it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from ..errors import CorruptRecordError
from ..locks import LockState, PendingCall, QueueMeta, RunClaim
from .base import Backend, Coalesce, Debounce, QueueMode

__all__ = ["AsyncBackend", "completed", "in_thread"]

T = TypeVar("T")
P = ParamSpec("P")


class AsyncBackend:
    """Awaits the primitives of ``sync`` (see :class:`~uniqjob.stores.base.Backend` for each).

    One ``async def`` per primitive, with the sync one's name and parameters. Here each runs the
    sync primitive through :meth:`run`, in a worker thread (:func:`in_thread`): right for any
    store whose calls may wait; a store's own face (memory's, Redis's) overrides them.
    """

    def __init__(self, sync: Backend) -> None:
        #: The sync backend this one acts on: the same store and records.
        self.sync = sync

    async def run(self, primitive: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Await ``primitive`` (a bound method of ``sync``) with these arguments: here, in a thread."""
        return await in_thread(primitive, *args, **kwargs)  # type: ignore[no-any-return]

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
        return await self.run(
            self.sync.claim, key, token, meta=meta, ttl=ttl, run=run, count=count, counted=counted,
            coalesce=coalesce, debounce=debounce,
        )  # fmt: skip

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
        return await self.run(
            self.sync.start, key, token, run=run, meta=meta, ttl=ttl, adopt=adopt, queue_lock=queue_lock,
            count=count, counted=counted,
        )  # fmt: skip

    async def attach(self, key: str, token: str, job_id: str) -> bool:
        return bool(await self.run(self.sync.attach, key, token, job_id))

    async def requeue(
        self, key: str, token: str, *, meta: QueueMeta, ttl: float | None, attempt: str = ""
    ) -> bool:
        return bool(await self.run(self.sync.requeue, key, token, meta=meta, ttl=ttl, attempt=attempt))

    async def renew(self, key: str, token: str, lease: float, attempt: str = "") -> bool:
        return bool(await self.run(self.sync.renew, key, token, lease, attempt))

    async def finish(
        self, key: str, token: str, *, keep_queue: bool = False, attempt: str = ""
    ) -> PendingCall | None:
        return await self.run(self.sync.finish, key, token, keep_queue=keep_queue, attempt=attempt)

    async def dequeue(self, key: str, token: str | None = None) -> bool:
        return bool(await self.run(self.sync.dequeue, key, token))

    async def reclaim(self, key: str, queue_token: str | None, run_token: str | None) -> bool:
        return bool(await self.run(self.sync.reclaim, key, queue_token, run_token))

    async def read(self, key: str) -> LockState:
        return await self.run(self.sync.read, key)

    async def read_many(self, keys: Sequence[str]) -> list[LockState | CorruptRecordError]:
        return await self.run(self.sync.read_many, keys)

    async def aclose(self) -> None:
        """Close what this object holds of its own (the sync backend is closed on its own)."""


async def in_thread(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``await asyncio.to_thread(function, ...)``, made even if the task is cancelled meanwhile.

    A cancelled ``to_thread`` drops a call still waiting for a worker thread, and one
    already running goes on: a release dropped would leave its lock or slot for a lease,
    an acquire going on could land after the undo that follows. So the call is always
    made, and the cancellation is raised once it has ended (what it took is then undone).
    """
    import asyncio  # here: the sync path (cron's `uniqjob run`) never loads asyncio

    return await completed(asyncio.to_thread(function, *args, **kwargs))


async def completed(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end even if the task is cancelled meanwhile; then raise the cancellation.

    However often it is cancelled: anyio's cancel scopes (Starlette, FastAPI) cancel
    every await inside them again until the scope exits, so a single shield would not do.
    """
    import asyncio

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
