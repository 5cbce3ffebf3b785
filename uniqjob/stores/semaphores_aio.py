"""The semaphore store contract's primitives as coroutines, for the asyncio API.

An :class:`AsyncSemaphores` stands beside a sync
:class:`~uniqjob.stores.semaphores.SemaphoreStore` (its ``sync``) and awaits the
same primitives, one typed ``async def`` each, with the sync one's name and
signature:

- the memory store is called in the event loop itself (:class:`DirectSemaphores`:
  it never waits on anything);
- any other store (files, a plugin) is called in a worker thread
  (:class:`AsyncSemaphores` itself), made to its end even if the task is
  cancelled meanwhile (:func:`~uniqjob.stores.aio.in_thread`);
- Redis awaits its scripts through ``redis.asyncio`` (chosen by
  :func:`uniqjob.concurrency._stores.async_semaphores`).

Each primitive hands the sync store's own bound method to :meth:`AsyncSemaphores.run`,
so a reader (and an IDE) goes from ``await astore.acquire(...)`` straight to
the store's ``acquire``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

from ..errors import CorruptRecordError
from ..locks import Holder
from .aio import in_thread
from .semaphores import HANDOFF, Outcome, Park, SemaphoreState, SemaphoreStore

__all__ = ["AsyncSemaphores", "DirectSemaphores"]

T = TypeVar("T")
P = ParamSpec("P")


class AsyncSemaphores:
    """Awaits the primitives of ``sync``, each in a worker thread (a store whose primitives may wait).

    Each is :class:`~uniqjob.stores.semaphores.SemaphoreStore`'s of the same name, awaited.
    """

    def __init__(self, sync: SemaphoreStore) -> None:
        #: The sync store this one acts on: the same slots and parked calls.
        self.sync = sync

    @property
    def name(self) -> str:
        """The sync store's name (in errors)."""
        return self.sync.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.sync!r})"

    async def run(self, primitive: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Await ``primitive`` (a bound method of ``sync``) with these arguments: here, in a thread."""
        return await in_thread(primitive, *args, **kwargs)  # type: ignore[no-any-return]

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
        return await self.run(self.sync.acquire, key, token, limit=limit, lease=lease, running=running,
                              holder=holder, park=park, job_class=job_class, args=args, caller=caller,
                              handoff=handoff)  # fmt: skip

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
        return await self.run(self.sync.start, key, token, holder=holder, lease=lease, takeover=takeover,
                              caller=caller, handoff=handoff)  # fmt: skip

    async def renew(
        self, key: str, token: str, lease: float, *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        return await self.run(self.sync.renew, key, token, lease, caller=caller, handoff=handoff)

    async def release(self, key: str, token: str, *, caller: Holder, handoff: float = HANDOFF) -> Outcome:
        return await self.run(self.sync.release, key, token, caller=caller, handoff=handoff)

    async def requeue(
        self, key: str, token: str, lease: float, *, holder: Holder, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        return await self.run(
            self.sync.requeue, key, token, lease, holder=holder, caller=caller, handoff=handoff
        )

    async def handed(self, key: str, token: str, promoter: Holder) -> bool:
        return await self.run(self.sync.handed, key, token, promoter)

    async def withdraw(self, key: str, token: str) -> Outcome:
        return await self.run(self.sync.withdraw, key, token)

    async def reap(
        self, key: str, dead: Sequence[tuple[str, Holder]], *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        return await self.run(self.sync.reap, key, dead, caller=caller, handoff=handoff)

    async def discard_parked(self, key: str) -> list[tuple[str, str]]:
        return await self.run(self.sync.discard_parked, key)

    async def drop(
        self, key: str, tokens: Sequence[str], *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        return await self.run(self.sync.drop, key, tokens, caller=caller, handoff=handoff)

    async def read(self, key: str, *, head: int = 5) -> SemaphoreState:
        return await self.run(self.sync.read, key, head=head)

    async def read_many(
        self, keys: Sequence[str], *, head: int = 5
    ) -> list[SemaphoreState | CorruptRecordError]:
        return await self.run(self.sync.read_many, keys, head=head)


class DirectSemaphores(AsyncSemaphores):
    """A store whose primitives never wait (memory): called in the event loop itself."""

    async def run(self, primitive: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return primitive(*args, **kwargs)
