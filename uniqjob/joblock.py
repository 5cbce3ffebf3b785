"""JobLock: one job call's hold on its key, above any backend.

This is where the policy lives once for every backend: reclaiming locks whose
holder is provably dead, keeping a run lock alive with the heartbeat, and
releasing only what is still ours. Queue integrations use it directly: the
enqueuing side calls :meth:`JobLock.acquire` and sends ``key`` and ``token``
with the job; the worker rebuilds the lock from them and runs the job inside
:meth:`JobLock.running`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .backends.base import Backend
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

__all__ = ["JobLock"]

log = logging.getLogger(__name__)

_ATTEMPTS = 3  # a reclaimed orphan is retried; a lock that keeps changing hands is a conflict


class JobLock:
    """The locks of one job call: ``key``, and ``token``, the proof that they are ours.

    ``lease`` (seconds) is how long the run lock outlives its last heartbeat;
    ``ttl`` bounds the queue lock's life from enqueue (autoexpire). With
    ``adopt``, :meth:`running` takes over a queued lock of any token, for
    queues that cannot carry the token to the worker.
    """

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
    ) -> None:
        self.backend = backend
        self.key = key
        self.token = token or new_token()
        self.lease = lease
        self.ttl = ttl
        self.meta = meta or QueueMeta()
        self.adopt = adopt
        #: The state that blocked the last failed acquire, for logs and errors.
        self.conflict: LockState | None = None
        self._beat: Beat | None = None

    def __repr__(self) -> str:
        return f"JobLock({self.key!r}, backend={self.backend!r})"

    @property
    def lost(self) -> bool:
        """True if the heartbeat found the run lock taken over by someone else."""
        return self._beat is not None and self._beat.lost.is_set()

    def acquire(self, *, run: bool = False, gone: Callable[[str], bool] | None = None) -> bool:
        """Take the queue lock; with ``run``, the run lock too, in one step. False on conflict.

        A lock whose holder is provably dead is reclaimed first. A queued lock
        is reclaimed only if ``gone(job_id)`` (the queue) proves its job will
        never run; autoexpire is the other way out. When in doubt, never delete.
        """
        for _ in range(_ATTEMPTS):
            claim = RunClaim(local_holder(), self.lease) if run else None
            state = self.backend.claim(self.key, self.token, meta=self.meta, ttl=self.ttl, run=claim)
            if state is None:
                self.conflict = None
                return True
            self.conflict = state
            if not (self._reclaim_dead(state) or self._reclaim_gone(state, gone)):
                return False
        return False

    def _reclaim_gone(self, state: LockState, gone: Callable[[str], bool] | None) -> bool:
        queue = state.queue
        if gone is None or queue is None or queue.state != QUEUED or not queue.meta.job_id:
            return False
        if not gone(queue.meta.job_id):
            return False
        log.warning("reclaiming lock %s: its job %s is gone from the queue", self.key, queue.meta.job_id)
        return self.backend.dequeue(self.key, queue.token)

    def _start(self) -> None:
        for _ in range(_ATTEMPTS):
            state = self.backend.start(
                self.key,
                self.token,
                run=RunClaim(local_holder(), self.lease),
                meta=self.meta,
                ttl=self.ttl,
                adopt=self.adopt,
            )
            if state is None:
                return
            self.conflict = state
            if not self._reclaim_dead(state):
                break
        assert self.conflict is not None
        raise JobNotUnique(self.key, self.conflict.describe())

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
        log.warning("reclaiming orphaned lock %s (holder %s)", self.key, state.describe())
        self.backend.reclaim(self.key, queue_token, run_token)
        return True

    @contextmanager
    def running(self, *, started: bool = False) -> Iterator[JobLock]:
        """Hold the run lock, renewed by the heartbeat, for the body; release both locks after.

        Raises :class:`JobNotUnique` if another live job holds the run lock.
        ``started`` says :meth:`acquire` already took it (``run=True``).
        """
        if not started:
            self._start()
        backend, key, token, lease = self.backend, self.key, self.token, self.lease
        self._beat = heartbeat.start(lambda: backend.renew(key, token, lease), lease / 3, key)
        try:
            yield self
        finally:
            self._beat.cancel()
            self.release()

    def release(self) -> None:
        """Release both locks if they are still ours.

        A store failure here is logged, not raised: the job has already run, and
        raising would invite a retry, a duplicate. The lock then lapses with its
        lease and is reclaimed as an orphan.
        """
        try:
            self.backend.finish(self.key, self.token)
        except BackendError:
            log.error("could not release %s; it lapses one lease from now", self.key, exc_info=True)

    def dequeue(self) -> bool:
        """Drop the queue lock while it is still queued and ours (its job left the queue)."""
        return self.backend.dequeue(self.key, self.token)

    def read(self) -> LockState:
        """Return the current state of this key's locks."""
        return self.backend.read(self.key)


def held(state: LockState, *, run_conflicts: bool) -> bool:
    """Would a claim conflict with ``state``? Orphans don't count.

    ``run_conflicts``: a live run lock alone conflicts too (a claim that starts
    running at once, as an inline enqueue does).
    """
    queue, run = state.queue, state.run
    run_alive = run is not None and not holder_is_dead(run.holder)
    if queue is not None and queue.state == QUEUED:
        return True
    if queue is not None:
        return run_alive
    return run_conflicts and run_alive
