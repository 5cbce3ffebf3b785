"""What the semaphore's two twins share, none of it a store call.

The waits' wake-ups (:class:`Waker`) and the registry of this process's inline
waiters, a promoted call's push to its queue (an async queue's, on the sync
path, awaited on a background loop), a running slot's :class:`Hold`, and
:class:`SemaphoreBase`: a semaphore's settings and the decisions that need no store.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import BackendError
from ..heartbeat import Beat
from ..locks import Holder, holder_is_dead
from ..stores._log import get_logger
from ..stores.aio import completed
from ..stores.semaphores import HANDOFF, ParkedInfo, Promotion, SemaphoreStore, SlotInfo
from ..stores.semaphores_aio import AsyncSemaphores
from ._stores import async_semaphores
from .codec import decode_call

if TYPE_CHECKING:
    from ..joblock import JobLock
    from .semaphore import Semaphore

T = TypeVar("T")

#: The semaphore's log, whichever twin writes to it.
log = get_logger("uniqjob.concurrency.semaphore")

ATTEMPTS = 3  # reaping dead holders and trying again; a key that keeps changing hands is full
POLL_MIN, POLL_MAX = 0.01, 0.2  # seconds between an inline waiter's polls (backing off)
SWEEP_EVERY = 1.0  # seconds between an inline waiter's checks of the holders' liveness
SWEEP_HEAD = 100  # parked places a sweep checks for dead inline waiters


async def aensured(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end even if the task is cancelled meanwhile; then raise the cancellation."""
    return await completed(awaitable)


def ensured(value: T) -> T:
    """The sync twin of :func:`aensured`: a sync call has ended by the time it returns its value."""
    return value


class Waker:
    """What an inline waiter of this process waits on: set by a promotion, from any thread.

    A sync waiter waits on its event; an async one on an :class:`asyncio.Event` of
    its loop, set through the loop (``call_soon_threadsafe``) by a promotion made anywhere.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._aevent: asyncio.Event | None = None

    def set(self) -> None:
        self._event.set()  # first: an async waiter checks it after making its event
        loop, aevent = self._loop, self._aevent
        if loop is not None and aevent is not None:
            with suppress(RuntimeError):  # its loop is closed: no one is waiting there any more
                loop.call_soon_threadsafe(aevent.set)

    def clear(self) -> None:
        self._event.clear()
        if self._aevent is not None:
            self._aevent.clear()

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` (blocking); True if woken."""
        return self._event.wait(seconds)

    async def await_(self, seconds: float) -> bool:
        """Await up to ``seconds`` (the event loop runs on); True if woken.

        A task whose cancellation was swallowed on the way here is cancelled now: on Python
        3.11, ``asyncio.wait_for`` (which redis-py's asyncio client awaits its socket through)
        returns a result that came with the cancellation and drops the cancellation, and the
        waiter would wait on for good, parked, with its caller awaiting it.
        """
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        if self._aevent is None:
            self._aevent = asyncio.Event()
            self._loop = asyncio.get_running_loop()
        if self._event.is_set():
            return True
        try:
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that comes as the
            # event is set (it returns the result instead), and the cancelled waiter waits on.
            async with asyncio.timeout(seconds):
                await self._aevent.wait()
        except TimeoutError:
            return self._event.is_set()
        return True


# Inline waiters of this process, woken when this process promotes them.
_waiters: dict[tuple[int, str, str], Waker] = {}
_waiters_mutex = threading.Lock()


def _sync_of(store: SemaphoreStore | AsyncSemaphores) -> SemaphoreStore:
    return store.sync if isinstance(store, AsyncSemaphores) else store


@contextmanager
def waiting(store: SemaphoreStore | AsyncSemaphores, key: str, token: str) -> Iterator[Waker]:
    """Register this process's inline waiter of ``token`` on ``key`` for the block; its :class:`Waker`."""
    slot, waker = (id(_sync_of(store)), key, token), Waker()
    with _waiters_mutex:
        _waiters[slot] = waker
    try:
        yield waker
    finally:
        with _waiters_mutex:
            _waiters.pop(slot, None)


def wake(store: SemaphoreStore | AsyncSemaphores, key: str, token: str) -> None:
    """Wake this process's inline waiter of ``token`` on ``key``, if it has one (a promotion came)."""
    with _waiters_mutex:
        event = _waiters.get((id(_sync_of(store)), key, token))
    if event is not None:
        event.set()


def promoted(
    store: SemaphoreStore | AsyncSemaphores, promotion: Promotion
) -> tuple[JobLock, Callable[[], Any]]:
    """The lock of a parked call whose turn came, and its push to its class's queue."""
    call = decode_call(promotion.payload)
    cls = call.job_class
    queue = cls.unique_queue
    if queue is None:
        raise BackendError(f"{cls.job_name()} has no unique_queue to push its parked job to", store.name)
    lock = cls.lock_from(call.lock_key, promotion.token)
    # In a context of its own: the promoted call is not the caller's call, and must not see
    # its context (Celery reads the task id and options of an apply_async from it).
    context = contextvars.Context()
    lock.meta = replace(lock.meta, job_id=context.run(queue.new_job_id))
    return lock, partial(context.run, queue.push, cls, lock, call.args, call.kwargs)


class _Background:
    """An event loop on a daemon thread of its own (started on first use), kept for the process.

    A promotion found on the sync path (the courier thread, a sync sweep) may be
    for a job class whose queue pushes with a coroutine (arq's): it is awaited
    there, and the caller waits for its result. The loop is kept, so the
    queue's connection pool, made per loop, is kept too.
    """

    def __init__(self) -> None:
        self._after_fork()
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._mutex = threading.Lock()  # the parent's loop thread does not survive fork
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` on the background loop; its result (or its exception, raised here)."""
        with self._mutex:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="uniqjob-background", daemon=True).start()

        async def awaited() -> Any:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(awaited(), loop).result()  # type: ignore[no-any-return]


_background = _Background()


def push_call(push: Callable[[], Any]) -> Any:
    """Call ``push``; an async queue's push (arq's) awaited on the background loop."""
    handle = push()
    if inspect.isawaitable(handle):
        return _background.run(handle)
    return handle


async def apush_call(push: Callable[[], Any]) -> Any:
    """:func:`push_call` on the asyncio path: an async queue's push awaited here."""
    handle = push()
    if inspect.isawaitable(handle):
        return await handle
    return handle


def dead(entries: Iterable[SlotInfo | ParkedInfo]) -> list[tuple[str, Holder]]:
    """(token, holder) of the slots or places whose holder is provably dead (this host only; elsewhere
    the lease decides)."""
    return [(e.token, e.holder) for e in entries if e.holder is not None and holder_is_dead(e.holder)]


class Hold:
    """A slot running in this process (see :meth:`Semaphore.running`), released when its body ends.

    A job that its queue will run again (a retry) keeps the slot instead: the
    retry has the same token, and holds the key's place while it waits.
    """

    def __init__(self, semaphore: Semaphore, token: str, beat: Beat | None) -> None:
        self.semaphore = semaphore
        self.token = token
        self.beat = beat  # None: a delivery that failed before its slot ran (nothing beats)
        #: True once the slot went to the job's retry: it is not released when the body ends.
        self.kept = False


class SemaphoreBase:
    """A :class:`~.semaphore.Semaphore`'s settings, and what it decides without its store."""

    def __init__(
        self,
        store: SemaphoreStore,
        key: str,
        *,
        limit: int,
        lease: float,
        interval: float,
        handoff: float = HANDOFF,
        job_class: str = "",
    ) -> None:
        self.store = store
        self.key = key
        self.limit = limit
        self.lease = lease
        self.interval = interval
        self.handoff = handoff
        self.job_class = job_class

    def __repr__(self) -> str:
        return f"Semaphore({self.key!r}, limit={self.limit}, store={self.store!r})"

    @property
    def astore(self) -> AsyncSemaphores:
        """The store's async face (the asyncio API awaits its primitives there)."""
        return async_semaphores(self.store)

    def _unreleased(self) -> None:
        log.error(
            "could not release concurrency slot of %s; it lapses with its lease", self.key, exc_info=True
        )
