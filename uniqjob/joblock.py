"""JobLock: one job call's hold on its key, above any backend.

This is where the policy lives once for every backend: reclaiming locks whose
holder is provably dead, keeping a run lock alive with the heartbeat, releasing
only what is still ours, and what each uniqueness strategy locks when. Queue
integrations use it directly: the enqueuing side calls :meth:`JobLock.acquire`
and sends ``key`` and ``token`` with the job; the worker rebuilds the lock from
them (``job_cls.lock_from(key, token)``) and runs the job with
``job_cls.execute(lock, args, kwargs)``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ContextDecorator
from contextvars import Token
from typing import TYPE_CHECKING, Any

from . import _joblock_sync
from ._joblock_base import STRATEGIES, Strategy, current
from ._undo import undos
from .heartbeat import Beat
from .locks import LockState, PendingCall, QueueMeta, new_token
from .stores.base import Backend, Coalesce, Debounce

if TYPE_CHECKING:
    from .stores.aio import AsyncBackend

__all__ = ["STRATEGIES", "JobLock", "Strategy", "current_lock"]


def current_lock() -> JobLock | None:
    """Return the lock of the ``perform`` running in this thread, or None outside one.

    A job passes ``current_lock().fence`` to the resource it writes, so that
    the resource can refuse a late write of a holder that lost its lock.
    """
    return current.get()


# The asyncio API's path (_joblock_async), and a store's async face, load on first use:
# a sync run never pays for them.
def _async_backend(backend: Backend) -> AsyncBackend:
    from .stores.aio import async_backend

    return async_backend(backend)


class JobLock:
    """The locks of one job call: ``key``, and ``token``, the proof that they are ours.

    ``lease`` (seconds) is how long the run lock outlives its last heartbeat;
    ``ttl`` bounds the queue lock's life from enqueue (autoexpire).
    ``strategy`` says what is locked when; ``limit`` lets up to that many calls
    hold one key at once (each under a key of its own: ``key``, ``key#2``, ...). With
    ``adopt``, :meth:`start` takes over a queued lock of any token, for queues
    that cannot carry the token to the worker.

    While the run lock is held, :attr:`fence` is the integer the store issued
    with it (strictly greater than any earlier one for the key), and
    :attr:`lost` turns true once the lock is lost or presumed lost: when a
    lease's worth of renewals (less a safety margin) has gone unconfirmed.
    ``on_lost`` is then called once, with the lock, from the heartbeat.
    """

    # One is made per enqueue: slots make it one allocation, not an object and its dict.
    __slots__ = (
        "__weakref__",
        "_attempt_token",
        "_base",
        "_beat",
        "_granted_at",
        "_key_fixed",
        "_outer",
        "adopt",
        "backend",
        "call",
        "coalesce",
        "conflict",
        "debounce",
        "delivered",
        "fence",
        "gone_tokens",
        "hand_on",
        "key",
        "lease",
        "limit",
        "meta",
        "on_lost",
        "pending",
        "replaced",
        "strategy",
        "token",
        "ttl",
    )

    def __init__(
        self,
        backend: Backend,
        key: str,
        *,
        token: str | None = None,
        lease: float = 30.0,
        ttl: float | None = None,
        meta: QueueMeta | None = None,
        adopt: bool = False,
        strategy: Strategy = "until_executed",
        limit: int = 1,
        on_lost: Callable[[JobLock], None] | None = None,
        coalesce: Coalesce = "",
        debounce: Debounce | None = None,
    ) -> None:
        self.backend = backend
        self.key = key
        self._base = key
        self.token = token or new_token()
        self.lease = lease
        self.ttl = ttl
        self.meta = meta or QueueMeta()
        self.adopt = adopt
        self.strategy: Strategy = strategy
        self.limit = limit
        #: The state that blocked the last failed acquire or start, for logs and errors.
        self.conflict: LockState | None = None
        # A key travelling with a job is the one it holds; a fresh lock picks one of candidate_keys().
        self._key_fixed = token is not None and strategy != "while_executing"
        #: A delivery's lock: its token came with its job, and the job's redeliveries share it.
        self.delivered = token is not None
        self._beat: Beat | None = None
        self._outer: Token[JobLock | None] | None = None  # current_lock()'s value before this lock's perform
        #: The fence of the run lock this call holds (or last held); None before it has one.
        self.fence: int | None = None
        self.on_lost = on_lost
        # Heartbeat clock when the request that granted the run lock was sent; None: not in
        # this process (the heartbeat then counts from when it starts).
        self._granted_at: float | None = None
        # Tells this delivery of the job from any other with the same token; made
        # when first needed (an enqueue that only queues never is).
        self._attempt_token: str | None = None
        #: Tokens of the queued locks that acquire() reclaimed because the queue proved their job gone.
        self.gone_tokens: list[str] = []
        #: What a conflicting claim asks the store to coalesce (see Backend.claim; the job's policy).
        self.coalesce: Coalesce = coalesce
        #: A debounced claim's delay and longest wait (see Backend.claim); None: none.
        self.debounce = debounce
        #: The latest call's arguments (JSON) its start was handed, to perform with; "" if none.
        self.call = ""
        #: The call that waited behind this one, queued by its release, for the job layer to push.
        self.pending: PendingCall | None = None
        #: How a release retried in the background pushes that call (the job layer's; see unreleased).
        self.hand_on: Callable[[str, PendingCall], bool] | None = None
        #: The job id of the queued call this one replaced (policy "replace"), for its queue to drop.
        self.replaced = ""

    def __repr__(self) -> str:
        return f"JobLock({self.key!r}, strategy={self.strategy!r}, backend={self.backend!r})"

    @property
    def _attempt(self) -> str:
        if self._attempt_token is None:
            self._attempt_token = new_token()
        return self._attempt_token

    @property
    def beat(self) -> Beat | None:
        """The heartbeat registration of the run lock while perform runs, else None."""
        return self._beat

    @property
    def lost(self) -> bool:
        """True once the run lock is lost (taken over) or presumed lost (renewals unconfirmed too long)."""
        beat = self._beat
        return beat is not None and beat.presumed_lost()

    def candidate_keys(self) -> list[str]:
        """Return the keys this lock may take: its own once taken, else one per allowed holder."""
        if self._key_fixed or self.limit == 1:
            return [self.key]
        return [self._base] + [f"{self._base}#{n}" for n in range(2, self.limit + 1)]

    # -- enqueue -----------------------------------------------------------------------
    # (each operation is written once, in _joblock_async.py; the sync API calls its generated twin)

    def acquire(self, *, run: bool = False, gone: Callable[[str], bool] | None = None) -> bool:
        """Take the queue lock; with ``run``, the run lock too, in one step. False on conflict.

        A lock whose holder is provably dead is reclaimed first. A queued lock
        is reclaimed only if ``gone(job_id)`` (the queue) proves its job will
        never run; autoexpire is the other way out. When in doubt, never delete.
        """
        return _joblock_sync.acquire(self, self.backend, run=run, gone=gone)

    async def aacquire(self, *, run: bool = False, gone: Callable[[str], Any] | None = None) -> bool:
        """:meth:`acquire`, awaited (``gone`` may be async)."""
        from . import _joblock_async

        return await _joblock_async.acquire(self, _async_backend(self.backend), run=run, gone=gone)

    def undo_start(self) -> None:
        """A start of this call's own (inline: ``run``, ``with``) failed or was cancelled with its request
        sent: undo its locks, token-checked, once the store answers.

        Left, an applied start would hold the key (its run lock, its queue lock running) for a
        whole lease and drop the next call as a duplicate. Only for a token that is the call's
        alone: a delivery's is shared with its retries, and is left to lapse.
        """
        backend, token, keys = self.backend, self.token, self.candidate_keys()
        what = f"the locks {keys[0]!r} of token {token}"
        undos.add(lambda: any([backend.reclaim(key, token, token) for key in keys]), what, (token,))

    # -- perform -----------------------------------------------------------------------

    def start(self) -> None:
        """Take what the strategy holds while perform runs; raise :class:`JobNotUnique` if held.

        ``until_executing`` holds nothing: its queue lock is released here.
        """
        _joblock_sync.start(self, self.backend)

    def running(self, *, started: bool = False, release: bool = True) -> _Running:
        """Hold the strategy's locks for the body, the run lock renewed by the heartbeat; release after.

        Raises :class:`JobNotUnique` if another live job holds the run lock.
        ``started`` says :meth:`start` (or ``acquire(run=True)``) already took it.
        With ``release=False`` the heartbeat stops after the body but the locks
        stay: the caller settles them with :meth:`release` or :meth:`requeue`
        once its queue has said whether the job runs again (a retry).
        """
        return _Running(self, started, release)

    def _lost(self) -> None:
        on_lost = self.on_lost
        if on_lost is not None:
            on_lost(self)

    # -- as a context manager: ``with Job.lock(...)`` / ``async with Job.lock(...)`` -----------

    def __enter__(self) -> JobLock:
        """Hold this call's locks for the ``with`` body, as ``Job.run()`` does; JobNotUnique if held.

        Released after the body.
        """
        return _joblock_sync.enter(self, self.backend)

    def __exit__(self, *exc_info: object) -> None:
        _joblock_sync.unhold(self, self.backend)

    async def __aenter__(self) -> JobLock:
        """:meth:`__enter__`, awaited: ``async with Job.lock(...) as lock:``."""
        from . import _joblock_async

        return await _joblock_async.enter(self, _async_backend(self.backend))

    async def __aexit__(self, *exc_info: object) -> None:
        from . import _joblock_async

        await _joblock_async.unhold(self, _async_backend(self.backend))

    # -- after perform -------------------------------------------------------------------

    def release(self) -> None:
        """Release what is still ours (``until_expired`` keeps its queue lock until it expires).

        Nothing here raises, whatever the store does: the job has already run,
        and raising would invite a retry, a duplicate. A failed release of a
        call's own locks is made again in the background until the store
        answers; a delivery's (its token shared with the job's redeliveries)
        lapse with their lease (see ``_joblock_base.unreleased``). A release
        interrupted on its way (a cancelled task, Ctrl-C) is sent again at once,
        before the cancellation goes on, which then waits for the store (at most
        its socket timeout).
        """
        _joblock_sync.release(self, self.backend)

    async def arelease(self) -> None:
        """:meth:`release`, awaited."""
        from . import _joblock_async

        await _joblock_async.release(self, _async_backend(self.backend))

    def requeue(self, *, delay: float = 0.0) -> bool:
        """Keep the key for a job that will run again (a retry); False if it is no longer ours.

        In one step the run lock goes and the strategy's queue lock is
        ``queued`` again, with this token and its job id, so duplicates still
        conflict while the retry waits; its autoexpire counts afresh from now
        plus ``delay`` (the wait before the retry).
        """
        return _joblock_sync.requeue(self, self.backend, delay=delay)

    async def arequeue(self, *, delay: float = 0.0) -> bool:
        """:meth:`requeue`, awaited."""
        from . import _joblock_async

        return await _joblock_async.requeue(self, _async_backend(self.backend), delay=delay)

    def attach(self) -> bool:
        """Record ``meta.job_id`` in the queue lock, once the queue holds the job; False if not ours."""
        return _joblock_sync.attach(self, self.backend)

    async def aattach(self) -> bool:
        """:meth:`attach`, awaited."""
        from . import _joblock_async

        return await _joblock_async.attach(self, _async_backend(self.backend))

    def dequeue(self) -> bool:
        """Drop the queue lock while it is still queued and ours (its job left the queue)."""
        return self.backend.dequeue(self.key, self.token)

    async def adequeue(self) -> bool:
        """:meth:`dequeue`, awaited."""
        return await _async_backend(self.backend).dequeue(self.key, self.token)

    def held(self, *, run_conflicts: bool = False) -> bool:
        """Would a claim of this key conflict now? Orphans don't count; every one of its keys must be held.

        ``run_conflicts``: a live run lock alone conflicts too (a claim that runs
        at once, as an inline enqueue does).
        """
        return _joblock_sync.held(self, self.backend, run_conflicts=run_conflicts)

    async def aheld(self, *, run_conflicts: bool = False) -> bool:
        """:meth:`held`, awaited."""
        from . import _joblock_async

        return await _joblock_async.held(self, _async_backend(self.backend), run_conflicts=run_conflicts)


class _Running(ContextDecorator):
    """What :meth:`JobLock.running` returns: the locks held and the heartbeat started on entry,
    stopped (and released) on exit.

    (A class rather than ``@contextmanager``: a full cycle enters one, and a
    generator's context manager costs three more calls and a generator.)
    """

    __slots__ = ("lock", "release", "started")

    def __init__(self, lock: JobLock, started: bool, release: bool) -> None:
        self.lock, self.started, self.release = lock, started, release

    def __enter__(self) -> JobLock:
        lock = self.lock
        _joblock_sync.hold(lock, lock.backend, started=self.started, releasing=self.release)
        return lock

    def __exit__(self, *exc_info: object) -> None:
        lock = self.lock
        _joblock_sync.unhold(lock, lock.backend, releasing=self.release)
