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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

from .backends.base import Backend, QueueMode
from .errors import BackendError, JobNotUnique
from .heartbeat import Beat, heartbeat
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

__all__ = ["STRATEGIES", "JobLock", "Strategy"]

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

_ATTEMPTS = 3  # a reclaimed orphan is retried; a lock that keeps changing hands is a conflict


class JobLock:
    """The locks of one job call: ``key``, and ``token``, the proof that they are ours.

    ``lease`` (seconds) is how long the run lock outlives its last heartbeat;
    ``ttl`` bounds the queue lock's life from enqueue (autoexpire).
    ``strategy`` says what is locked when; ``limit`` lets up to that many calls
    hold one key at once (each in its own slot: ``key``, ``key#2``, ...). With
    ``adopt``, :meth:`start` takes over a queued lock of any token, for queues
    that cannot carry the token to the worker.
    """

    # One is made per enqueue: slots make it one allocation, not an object and its dict.
    __slots__ = (
        "__weakref__",
        "_attempt_token",
        "_base",
        "_beat",
        "_slot_fixed",
        "adopt",
        "backend",
        "conflict",
        "gone_tokens",
        "key",
        "lease",
        "limit",
        "meta",
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
        # A key travelling with a job names its slot; a fresh lock picks one.
        self._slot_fixed = token is not None and strategy != "while_executing"
        self._beat: Beat | None = None
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
    def lost(self) -> bool:
        """True if the heartbeat found the run lock taken over by someone else."""
        return self._beat is not None and self._beat.lost.is_set()

    def slots(self) -> list[str]:
        """Return the keys this lock may take: its own once taken, else one per allowed holder."""
        if self._slot_fixed or self.limit == 1:
            return [self.key]
        return [self._base] + [f"{self._base}#{n}" for n in range(2, self.limit + 1)]

    # -- enqueue -----------------------------------------------------------------------

    def acquire(self, *, run: bool = False, gone: Callable[[str], bool] | None = None) -> bool:
        """Take the queue lock; with ``run``, the run lock too, in one step. False on conflict.

        A lock whose holder is provably dead is reclaimed first. A queued lock
        is reclaimed only if ``gone(job_id)`` (the queue) proves its job will
        never run; autoexpire is the other way out. When in doubt, never delete.
        """
        claim = RunClaim(local_holder(), self.lease, self._attempt) if run else None
        # The job id is recorded by attach() once the queue holds the job: a
        # lock naming a job its queue has not yet seen would look "gone".
        meta = self.meta
        if meta.job_id:
            meta = QueueMeta(meta.cls, meta.args)  # replace(meta, job_id=""), minus its introspection
        for slot in self.slots():
            for _ in range(_ATTEMPTS):
                state = self.backend.claim(slot, self.token, meta=meta, ttl=self.ttl, run=claim)
                if state is None:
                    self.key, self.conflict, self._slot_fixed = slot, None, True
                    return True
                self.conflict = state
                if state.quiet:
                    break  # the usual duplicate: queued, nothing running, no job a queue could prove gone
                if not (self._reclaim_dead(state) or self._reclaim_gone(state, gone)):
                    break
        return False

    def _reclaim_gone(self, state: LockState, gone: Callable[[str], bool] | None) -> bool:
        queue = state.queue
        if gone is None or queue is None or queue.state != QUEUED or not queue.meta.job_id:
            return False
        if not gone(queue.meta.job_id):
            return False
        log.warning("reclaiming lock %s: its job %s is gone from the queue", state.key, queue.meta.job_id)
        if not self.backend.dequeue(state.key, queue.token):
            return False
        self.gone_tokens.append(queue.token)
        return True

    def _reclaim_dead(self, state: LockState) -> bool:
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
        log.warning("reclaiming orphaned lock %s (holder %s)", state.key, state.describe())
        self.backend.reclaim(state.key, queue_token, run_token)
        return True

    # -- perform -----------------------------------------------------------------------

    def start(self) -> None:
        """Take what the strategy holds while perform runs; raise :class:`JobNotUnique` if held.

        ``until_executing`` holds nothing: its queue lock is released here.
        """
        mode = _AT_START[self.strategy]
        if mode is None:
            self.backend.dequeue(self.key, None if self.adopt else self.token)
            return
        claim = RunClaim(local_holder(), self.lease, self._attempt)
        for slot in self.slots():
            for _ in range(_ATTEMPTS):
                state = self.backend.start(
                    slot, self.token, run=claim, meta=self.meta, ttl=self.ttl, adopt=self.adopt, queue=mode
                )
                if state is None:
                    self.key, self.conflict, self._slot_fixed = slot, None, True
                    return
                self.conflict = state
                if not self._reclaim_dead(state):
                    break
        assert self.conflict is not None
        raise JobNotUnique(self.key, self.conflict.describe())

    @contextmanager
    def running(self, *, started: bool = False, release: bool = True) -> Iterator[JobLock]:
        """Hold the strategy's locks for the body, the run lock renewed by the heartbeat; release after.

        Raises :class:`JobNotUnique` if another live job holds the run lock.
        ``started`` says :meth:`start` (or ``acquire(run=True)``) already took it.
        With ``release=False`` the heartbeat stops after the body but the locks
        stay: the caller settles them with :meth:`release` or :meth:`requeue`
        once its queue has said whether the job runs again (a retry).
        """
        if not started:
            self.start()
        if _AT_START[self.strategy] is None:
            yield self
            return
        backend, key, token, lease = self.backend, self.key, self.token, self.lease
        self._beat = heartbeat.start(lambda: backend.renew(key, token, lease), lease / 3, key)
        try:
            yield self
        finally:
            self._beat.cancel()
            if release:
                self.release()

    def release(self) -> None:
        """Release what is still ours (``until_expired`` keeps its queue lock until it expires).

        A store failure here is logged, not raised: the job has already run, and
        raising would invite a retry, a duplicate. The lock then lapses with its
        lease and is reclaimed as an orphan.
        """
        try:
            self.backend.finish(self.key, self.token, keep_queue=self.strategy == "until_expired")
        except BackendError:
            log.error("could not release %s; it lapses one lease from now", self.key, exc_info=True)

    def requeue(self, *, delay: float = 0.0) -> bool:
        """Keep the key for a job that will run again (a retry); False if it is no longer ours.

        In one step the run lock goes and the strategy's queue lock is
        ``queued`` again, with this token and its job id, so duplicates still
        conflict while the retry waits; its autoexpire counts afresh from now
        plus ``delay`` (the wait before the retry).
        """
        if self._beat is not None:
            self._beat.cancel()
        if self.strategy in ("while_executing", "until_expired"):
            # nothing to hold while waiting / a queue lock that perform never touches
            self.backend.reclaim(self.key, None, self.token)
            return True
        ttl = None if self.ttl is None else self.ttl + delay
        if self.backend.requeue(self.key, self.token, meta=self.meta, ttl=ttl):
            return True
        log.warning("%s was taken by another enqueue while its job waited for a retry", self.key)
        return False

    def attach(self) -> bool:
        """Record ``meta.job_id`` in the queue lock, once the queue holds the job; False if not ours."""
        if not self.meta.job_id:
            return False
        return self.backend.attach(self.key, self.token, self.meta.job_id)

    def dequeue(self) -> bool:
        """Drop the queue lock while it is still queued and ours (its job left the queue)."""
        return self.backend.dequeue(self.key, self.token)

    def held(self, *, run_conflicts: bool = False) -> bool:
        """Would a claim of this key conflict now? Orphans don't count; every slot must be held.

        ``run_conflicts``: a live run lock alone conflicts too (a claim that runs
        at once, as an inline enqueue does).
        """
        return all(_held(self.backend.read(slot), run_conflicts) for slot in self.slots())


def _held(state: LockState, run_conflicts: bool) -> bool:
    queue, run = state.queue, state.run
    run_alive = run is not None and not holder_is_dead(run.holder)
    if queue is not None and queue.state == QUEUED:
        return True
    if queue is not None:
        return run_alive
    return run_conflicts and run_alive
