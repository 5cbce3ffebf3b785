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

import logging
from collections.abc import Callable
from contextlib import ContextDecorator
from contextvars import ContextVar, Token
from typing import Any, Literal

from ._steps import Steps, adrive, drive, twin_of
from ._undo import undos
from .errors import BackendError, CorruptRecordError, JobNotUnique, holder_text
from .heartbeat import Beat, deadline, heartbeat
from .locks import (
    QUEUED,
    RUNNING,
    LockState,
    QueueMeta,
    RunClaim,
    holder_is_dead,
    local_holder,
    new_token,
)
from .stores.aio import made
from .stores.base import Backend, QueueMode

__all__ = ["STRATEGIES", "JobLock", "Strategy", "current_lock"]

log = logging.getLogger(__name__)

Strategy = Literal[
    "until_executed",
    "until_executing",
    "while_executing",
    "until_and_while_executing",
    "until_expired",
]
STRATEGIES: tuple[Strategy, ...] = (
    "until_executed",
    "until_executing",
    "while_executing",
    "until_and_while_executing",
    "until_expired",
)

# What each strategy does when perform starts: whether it holds a run lock, and
# what taking it does to the queue lock (see Backend.start).
_AT_START: dict[Strategy, QueueMode | None] = {
    "until_executed": "run",
    "until_executing": None,  # no run lock: the queue lock is simply released
    "while_executing": "keep",
    "until_and_while_executing": "release",
    "until_expired": "keep",
}

_NONE: dict[str, Any] = {}  # a step's keyword arguments: none

_ATTEMPTS = 3  # a reclaimed orphan is retried; a lock that keeps changing hands is a conflict

# The lock of the perform running in this thread (or task): see current_lock().
_current: ContextVar[JobLock | None] = ContextVar("uniqjob_current_lock", default=None)


def current_lock() -> JobLock | None:
    """Return the lock of the ``perform`` running in this thread, or None outside one.

    A job passes ``current_lock().fence`` to the resource it writes, so that
    the resource can refuse a late write of a holder that lost its lock.
    """
    return _current.get()


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
        "conflict",
        "fence",
        "gone_tokens",
        "key",
        "lease",
        "limit",
        "meta",
        "on_lost",
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
    #
    # Each transition is written once, as steps (see uniqjob._steps): the sync method drives
    # them by calling the store, the asyncio API (aacquire(), ``async with``, Job.arun()) by
    # awaiting it.

    def acquire(self, *, run: bool = False, gone: Callable[[str], bool] | None = None) -> bool:
        """Take the queue lock; with ``run``, the run lock too, in one step. False on conflict.

        A lock whose holder is provably dead is reclaimed first. A queued lock
        is reclaimed only if ``gone(job_id)`` (the queue) proves its job will
        never run; autoexpire is the other way out. When in doubt, never delete.
        """
        return drive(self.backend, self.acquire_steps(run=run, gone=gone))

    async def aacquire(self, *, run: bool = False, gone: Callable[[str], Any] | None = None) -> bool:
        """:meth:`acquire`, awaited (``gone`` may be async)."""
        return await adrive(self.backend, self.acquire_steps(run=run, gone=gone))

    def acquire_steps(self, *, run: bool = False, gone: Callable[[str], Any] | None = None) -> Steps[bool]:
        """The steps of :meth:`acquire`."""
        claim = RunClaim(local_holder(), self.lease, self._attempt) if run else None
        # The job id is recorded by attach() once the queue holds the job: a
        # lock naming a job its queue has not yet seen would look "gone".
        meta = self.meta
        if meta.job_id:
            meta = QueueMeta(meta.cls, meta.args)  # replace(meta, job_id=""), minus its introspection
        candidates = self.candidate_keys()
        for candidate in candidates:
            # Only the last candidate key's refusal is a duplicate (see Backend.duplicates), counted once.
            count, counted = candidate == candidates[-1], None
            for _ in range(_ATTEMPTS):
                self._granted_at = heartbeat.clock()
                try:
                    state = yield (
                        "claim",
                        (candidate, self.token),
                        {"meta": meta, "ttl": self.ttl, "run": claim, "count": count, "counted": counted},
                    )
                except CorruptRecordError:
                    raise  # the store answered: nothing was applied
                except BaseException:  # the store failed, or the caller was cancelled: it may be applied
                    self._undo_claim(candidate)
                    raise
                if state is None:
                    self.key, self.conflict, self._key_fixed = candidate, None, True
                    if claim is not None:
                        self.fence = claim.fence
                    return True
                self.conflict = state
                if state.nothing_to_reclaim and not undos.pending:
                    break  # the usual duplicate: queued, nothing running, no job a queue could prove gone
                if not (
                    (yield from self._reclaim_ours(state))
                    or (yield from self._reclaim_dead(state))
                    or (yield from self._reclaim_gone(state, gone))
                ):
                    break
                counted = self._counted(state, count, counted)
        return False

    def _counted(self, refused: LockState, count: bool, counted: float | None) -> float | None:
        """When the store counted this call's refusal ``refused`` as a duplicate, for a retry to take back."""
        if not count or counted is not None:
            return counted
        run = refused.run
        if not self.meta.cls or (run is not None and run.token == self.token):
            return None  # not counted: no class, or a second delivery of this job
        return refused.now

    def _undo_claim(self, key: str) -> None:
        """A claim failed but may have been applied: undo it, token-checked, once the store answers.

        The lock then draws a new token, so nothing it takes later carries
        the one being undone.
        """
        backend, token = self.backend, self.token
        undos.add(lambda: backend.reclaim(key, token, token), f"the lock {key!r} of token {token}", (token,))
        self.token = new_token()

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

    def _reclaim_ours(self, state: LockState) -> Steps[bool]:
        """Remove a lock left by one of this process's own failed steps (see uniqjob._undo); True if any."""
        queue, run = state.queue, state.run
        queue_token = queue.token if queue is not None and undos.owns(queue.token) else None
        run_token = run.token if run is not None and undos.owns(run.token) else None
        if queue_token is None and run_token is None:
            return False
        return bool((yield ("reclaim", (state.key, queue_token, run_token), _NONE)))

    def _reclaim_gone(self, state: LockState, gone: Callable[[str], Any] | None) -> Steps[bool]:
        queue = state.queue
        if gone is None or queue is None or queue.state != QUEUED or not queue.meta.job_id:
            return False
        if not (yield (gone, (queue.meta.job_id,), _NONE)):
            return False
        log.warning("reclaiming lock %s: its job %s is gone from the queue", state.key, queue.meta.job_id)
        if not (yield ("dequeue", (state.key, queue.token), _NONE)):
            return False
        self.gone_tokens.append(queue.token)
        return True

    def _reclaim_dead(self, state: LockState) -> Steps[bool]:
        """Reclaim the locks of a holder that is provably dead; True if worth retrying."""
        queue, run = state.queue, state.run
        if run is not None:
            if not holder_is_dead(run.holder):
                return False
            # The queue lock goes with a dead holder only if it says "running";
            # a queued lock belongs to a job still waiting in its queue.
            queue_token = queue.token if queue is not None and queue.state == RUNNING else None
            run_token: str | None = run.token
        elif queue is not None and queue.state == RUNNING:
            queue_token, run_token = queue.token, None  # its lease lapsed a moment ago
        else:
            return False
        why = "its holder is dead" if run is not None else "its run lock's lease lapsed"
        log.warning(
            "reclaiming orphaned lock %s: %s (it was %s)", state.key, why, holder_text(state.describe())
        )
        yield ("reclaim", (state.key, queue_token, run_token), _NONE)
        return True

    # -- perform -----------------------------------------------------------------------

    def start(self) -> None:
        """Take what the strategy holds while perform runs; raise :class:`JobNotUnique` if held.

        ``until_executing`` holds nothing: its queue lock is released here.
        """
        drive(self.backend, self.start_steps())

    def start_steps(self) -> Steps[None]:
        """The steps of :meth:`start`."""
        mode = _AT_START[self.strategy]
        if mode is None:
            yield ("dequeue", (self.key, None if self.adopt else self.token), _NONE)
            return
        claim = RunClaim(local_holder(), self.lease, self._attempt)
        candidates = self.candidate_keys()
        for candidate in candidates:
            count, counted = candidate == candidates[-1], None
            for _ in range(_ATTEMPTS):
                self._granted_at = heartbeat.clock()
                # A start that fails is not undone here: the token is its job's, and a second
                # delivery may re-take the run lock with it. If it was applied, the lease lapses
                # and its queue lock is then an orphan; the job layer drops an inline call's
                # queued lock.
                state = yield (
                    "start",
                    (candidate, self.token),
                    {
                        "run": claim,
                        "meta": self.meta,
                        "ttl": self.ttl,
                        "adopt": self.adopt,
                        "queue_lock": mode,
                        "count": count,
                        "counted": counted,
                    },
                )
                if state is None:
                    self.key, self.conflict, self._key_fixed = candidate, None, True
                    self.fence = claim.fence
                    return
                self.conflict = state
                if not (yield from self._reclaim_dead(state)):
                    break
                counted = self._counted(state, count, counted)
        assert self.conflict is not None
        raise JobNotUnique(self.key, self.conflict.describe())

    def running(self, *, started: bool = False, release: bool = True) -> _Running:
        """Hold the strategy's locks for the body, the run lock renewed by the heartbeat; release after.

        Raises :class:`JobNotUnique` if another live job holds the run lock.
        ``started`` says :meth:`start` (or ``acquire(run=True)``) already took it.
        With ``release=False`` the heartbeat stops after the body but the locks
        stay: the caller settles them with :meth:`release` or :meth:`requeue`
        once its queue has said whether the job runs again (a retry).
        """
        return _Running(self, started, release)

    def hold_steps(self, *, started: bool = False, release: bool = True) -> Steps[None]:
        """The steps that begin :meth:`running`: start, and the heartbeat; ``unhold_steps`` end it."""
        if not started:
            yield from self.start_steps()
        if _AT_START[self.strategy] is None:
            return
        backend, key, token, lease = self.backend, self.key, self.token, self.lease
        attempt = self._attempt  # a second delivery of this job (same token) is another attempt's

        def renew() -> bool:
            return backend.renew(key, token, lease, attempt)

        granted = self._granted_at
        if granted is not None and heartbeat.clock() >= deadline(granted, lease):
            yield from self._confirm(release)
        # The heartbeat renews through the sync backend on its own threads, for async holders
        # too: an event loop kept busy by other tasks cannot starve it.
        self._beat = heartbeat.start(
            renew,
            lease / 3,
            key,
            lease=lease,
            confirmed=self._granted_at,
            on_lost=self._lost,
            group=backend,
        )
        self._outer = _current.set(self)

    def unhold_steps(self, *, release: bool = True) -> Steps[None]:
        """The steps that end :meth:`running`: the heartbeat stops and (with ``release``) the locks go."""
        outer, self._outer = self._outer, None
        if outer is not None:
            _current.reset(outer)
        if self._beat is not None:
            self._beat.cancel()
        if release:
            yield from self.release_steps()

    def _confirm(self, release: bool) -> Steps[None]:
        """The grant's reply came too late to count on its lease: renew once before perform, or give up.

        (A claim sent just before a stall is granted when the store wakes, and
        its reply may arrive after the holder's own deadline.) If the renewal
        is not confirmed, the locks go (unless the caller settles them) and
        :class:`BackendError` says why: perform does not start.
        """
        sent = heartbeat.clock()
        try:
            mine = yield ("renew", (self.key, self.token, self.lease, self._attempt), _NONE)
        except GeneratorExit:
            raise
        except BaseException:  # the store failed, or the caller was cancelled: perform does not start
            if release:
                yield from self.release_steps()
            raise
        if not mine:
            if release:
                yield from self.release_steps()
            raise BackendError(
                f"the lock {self.key!r} was granted too late to rely on and was gone when renewed; "
                "the job did not run",
                self.backend.name,
            )
        self._granted_at = sent

    def _lost(self) -> None:
        on_lost = self.on_lost
        if on_lost is not None:
            on_lost(self)

    # -- as a context manager: ``with Job.lock(...)`` / ``async with Job.lock(...)`` -----------

    def enter_steps(self) -> Steps[JobLock]:
        """Take what the strategy holds while its job runs, as ``Job.run()`` does; JobNotUnique if held."""
        if self.strategy == "until_executed":
            if not (yield from self.acquire_steps(run=True)):
                assert self.conflict is not None
                raise JobNotUnique(self.key, self.conflict.describe())
            yield from self.hold_steps(started=True)
            return self
        if self.strategy != "while_executing" and not (yield from self.acquire_steps()):
            assert self.conflict is not None
            raise JobNotUnique(self.key, self.conflict.describe())
        try:
            yield from self.start_steps()
        except JobNotUnique:
            yield ("dequeue", (self.key, self.token), _NONE)
            raise
        except GeneratorExit:
            raise
        except BaseException:  # the start failed or was cancelled with its request sent: it may be applied
            self.undo_start()
            raise
        yield from self.hold_steps(started=True)  # (a late grant it cannot confirm releases the locks)
        return self

    def __enter__(self) -> JobLock:
        """Hold this call's locks for the ``with`` body (see :meth:`enter_steps`); released after."""
        return drive(self.backend, self.enter_steps())

    def __exit__(self, *exc_info: object) -> None:
        drive(self.backend, self.unhold_steps())

    async def __aenter__(self) -> JobLock:
        """:meth:`__enter__`, awaited: ``async with Job.lock(...) as lock:``."""
        return await adrive(self.backend, self.enter_steps())

    async def __aexit__(self, *exc_info: object) -> None:
        await adrive(self.backend, self.unhold_steps())

    # -- after perform -------------------------------------------------------------------

    def release(self) -> None:
        """Release what is still ours (``until_expired`` keeps its queue lock until it expires).

        Nothing here raises, whatever the store does: the job has already run,
        and raising would invite a retry, a duplicate. After a failed release
        the run lock lapses with its lease, and its queue lock is then an
        orphan that the next enqueue reclaims. (A failed release is not retried
        later: a second delivery of this job may hold the same token by then.) A
        release interrupted on its way (a cancelled task, Ctrl-C) is sent again at
        once, before the cancellation goes on, which then waits for the store (at
        most its socket timeout).
        """
        drive(self.backend, self.release_steps())

    async def arelease(self) -> None:
        """:meth:`release`, awaited."""
        await adrive(self.backend, self.release_steps())

    def release_steps(self) -> Steps[None]:
        """The steps of :meth:`release`."""
        key, token, keep, attempt = self.key, self.token, self.strategy == "until_expired", self._attempt
        try:
            yield ("finish", (key, token), {"keep_queue": keep, "attempt": attempt})
        except Exception as exc:  # whatever the client raised: see release()
            self._unreleased(exc)
        except GeneratorExit:
            raise
        except BaseException:
            # Cancelled (asyncio) or interrupted while the release was under way: it may not
            # have been sent, and then its locks would refuse the key for a whole lease. So it
            # is made to its end before the cancellation goes on, however often the task is
            # cancelled meanwhile; made twice, it changes nothing more (token- and
            # attempt-checked: a live delivery of the same job is left alone).
            backend = self.backend
            try:
                yield twin_of(
                    backend.finish, made(backend, "finish"), key, token, keep_queue=keep, attempt=attempt
                )
            except Exception as exc:
                self._unreleased(exc)
            raise

    def _unreleased(self, exc: Exception) -> None:
        # A running lock lapses with its lease; a queued one (while_executing never
        # has one) needs its queue or autoexpire, as any queued lock does.
        log.error("could not release %s (%s); its run lock lapses one lease from now", self.key, exc)

    def requeue(self, *, delay: float = 0.0) -> bool:
        """Keep the key for a job that will run again (a retry); False if it is no longer ours.

        In one step the run lock goes and the strategy's queue lock is
        ``queued`` again, with this token and its job id, so duplicates still
        conflict while the retry waits; its autoexpire counts afresh from now
        plus ``delay`` (the wait before the retry).
        """
        return drive(self.backend, self.requeue_steps(delay=delay))

    async def arequeue(self, *, delay: float = 0.0) -> bool:
        """:meth:`requeue`, awaited."""
        return await adrive(self.backend, self.requeue_steps(delay=delay))

    def requeue_steps(self, *, delay: float = 0.0) -> Steps[bool]:
        """The steps of :meth:`requeue`."""
        if self._beat is not None:
            self._beat.cancel()
        if self.strategy in ("while_executing", "until_expired"):
            # nothing to hold while waiting / a queue lock that perform never touches
            yield ("finish", (self.key, self.token), {"keep_queue": True, "attempt": self._attempt})
            return True
        ttl = None if self.ttl is None else self.ttl + delay
        kwargs = {"meta": self.meta, "ttl": ttl, "attempt": self._attempt}
        if (yield ("requeue", (self.key, self.token), kwargs)):
            return True
        log.warning("%s was taken by another enqueue while its job waited for a retry", self.key)
        return False

    def attach(self) -> bool:
        """Record ``meta.job_id`` in the queue lock, once the queue holds the job; False if not ours."""
        return drive(self.backend, self.attach_steps())

    def attach_steps(self) -> Steps[bool]:
        """The steps of :meth:`attach`."""
        if not self.meta.job_id:
            return False
        return bool((yield ("attach", (self.key, self.token, self.meta.job_id), _NONE)))

    def dequeue(self) -> bool:
        """Drop the queue lock while it is still queued and ours (its job left the queue)."""
        return self.backend.dequeue(self.key, self.token)

    def dequeue_steps(self) -> Steps[bool]:
        """The steps of :meth:`dequeue`."""
        return bool((yield ("dequeue", (self.key, self.token), _NONE)))

    def held(self, *, run_conflicts: bool = False) -> bool:
        """Would a claim of this key conflict now? Orphans don't count; every one of its keys must be held.

        ``run_conflicts``: a live run lock alone conflicts too (a claim that runs
        at once, as an inline enqueue does).
        """
        return drive(self.backend, self.held_steps(run_conflicts=run_conflicts))

    async def aheld(self, *, run_conflicts: bool = False) -> bool:
        """:meth:`held`, awaited."""
        return await adrive(self.backend, self.held_steps(run_conflicts=run_conflicts))

    def held_steps(self, *, run_conflicts: bool = False) -> Steps[bool]:
        """The steps of :meth:`held`."""
        for candidate in self.candidate_keys():
            if not _held((yield ("read", (candidate,), _NONE)), run_conflicts):
                return False
        return True


class _Running(ContextDecorator):
    """What :meth:`JobLock.running` returns: ``hold_steps`` driven on entry, ``unhold_steps`` on exit.

    (A class rather than ``@contextmanager``: a full cycle enters one, and a
    generator's context manager costs three more calls and a generator.)
    """

    __slots__ = ("lock", "release", "started")

    def __init__(self, lock: JobLock, started: bool, release: bool) -> None:
        self.lock, self.started, self.release = lock, started, release

    def __enter__(self) -> JobLock:
        lock = self.lock
        drive(lock.backend, lock.hold_steps(started=self.started, release=self.release))
        return lock

    def __exit__(self, *exc_info: object) -> None:
        lock = self.lock
        drive(lock.backend, lock.unhold_steps(release=self.release))


def _held(state: LockState, run_conflicts: bool) -> bool:
    queue, run = state.queue, state.run
    run_alive = run is not None and not holder_is_dead(run.holder)
    if queue is not None and queue.state == QUEUED:
        return True
    if queue is not None:
        return run_alive
    return run_conflicts and run_alive
