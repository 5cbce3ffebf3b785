"""The job lock's rules that do no I/O, shared by its two twins (``_joblock_async``, ``_joblock_sync``).

What each strategy holds when, which conflicts are worth reclaiming and how, which
refusal the store counted as a duplicate, what a failed step leaves to undo: decided
here once, the same for the sync and the asyncio API.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Literal, get_args

from ._undo import undos
from .errors import holder_text
from .locks import QUEUED, RUNNING, LockState, QueueMeta, holder_is_dead, new_token
from .stores._log import get_logger
from .stores.base import QueueMode

if TYPE_CHECKING:
    from .joblock import JobLock

__all__ = [
    "ATTEMPTS",
    "AT_START",
    "STRATEGIES",
    "Strategy",
    "claim_meta",
    "counted",
    "current",
    "dead_tokens",
    "gone_job",
    "held_by",
    "our_tokens",
    "undo_claim",
    "unreleased",
]

# The job lock's logger (uniqjob.joblock), named in the README: its reclaims and failed releases.
log = get_logger("uniqjob.joblock")

Strategy = Literal[
    "until_executed",
    "until_executing",
    "while_executing",
    "until_and_while_executing",
    "until_expired",
]
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)

#: What each strategy does when perform starts: whether it holds a run lock, and what taking
#: it does to the queue lock (see Backend.start).
AT_START: dict[Strategy, QueueMode | None] = {
    "until_executed": "run",
    "until_executing": None,  # no run lock: the queue lock is simply released
    "while_executing": "keep",
    "until_and_while_executing": "release",
    "until_expired": "keep",
}

#: A reclaimed orphan is retried; a lock that keeps changing hands is a conflict.
ATTEMPTS = 3

#: The lock of the perform running in this thread (or task): see joblock.current_lock().
current: ContextVar[JobLock | None] = ContextVar("uniqjob_current_lock", default=None)


def claim_meta(lock: JobLock, *, with_job_id: bool = False) -> QueueMeta:
    """The queue lock's meta at a claim: without the job id, recorded by attach() once the queue
    holds the job (a lock naming a job its queue has not yet seen would look "gone"), unless
    ``with_job_id``: the caller chose the id before the claim, and asks its queue about the job
    only once the lock is old enough (:func:`gone_job`'s ``after``)."""
    meta = lock.meta
    if meta.job_id and not with_job_id:
        return QueueMeta(meta.cls, meta.args, "", meta.call)  # replace(meta, job_id=""), quicker
    return meta


def counted(lock: JobLock, refused: LockState, count: bool, before: float | None) -> float | None:
    """When the store counted ``lock``'s refusal ``refused`` as a duplicate, for a retry to take back."""
    if not count or before is not None:
        return before
    run = refused.run
    if not lock.meta.cls or (run is not None and run.token == lock.token):
        return None  # not counted: no class, or a second delivery of this job
    return refused.now


def undo_claim(lock: JobLock, key: str) -> None:
    """A claim failed but may have been applied: undo it, token-checked, once the store answers.

    The lock then draws a new token, so nothing it takes later carries the one being undone.
    """
    backend, token = lock.backend, lock.token
    undos.add(lambda: backend.reclaim(key, token, token), f"the lock {key!r} of token {token}", (token,))
    lock.token = new_token()


def our_tokens(state: LockState) -> tuple[str | None, str | None] | None:
    """The tokens of locks in ``state`` left by this process's own failed steps (see uniqjob._undo)."""
    queue, run = state.queue, state.run
    queue_token = queue.token if queue is not None and undos.owns(queue.token) else None
    run_token = run.token if run is not None and undos.owns(run.token) else None
    if queue_token is None and run_token is None:
        return None
    return queue_token, run_token


def dead_tokens(state: LockState) -> tuple[str | None, str | None] | None:
    """The tokens to reclaim of a holder that is provably dead (logged); None if it is not."""
    queue, run = state.queue, state.run
    if run is not None:
        if not holder_is_dead(run.holder):
            return None
        # The queue lock goes with a dead holder only if it says "running";
        # a queued lock belongs to a job still waiting in its queue.
        queue_token = queue.token if queue is not None and queue.state == RUNNING else None
        run_token: str | None = run.token
    elif queue is not None and queue.state == RUNNING:
        queue_token, run_token = queue.token, None  # its lease lapsed a moment ago
    else:
        return None
    why = "its holder is dead" if run is not None else "its run lock's lease lapsed"
    log.warning("reclaiming orphaned lock %s: %s (it was %s)", state.key, why, holder_text(state.describe()))
    return queue_token, run_token


def gone_job(state: LockState, after: float = 0.0) -> str:
    """The job id of ``state``'s queued lock that its queue may prove gone; "" if none.

    ``after``: none either while the lock is younger than that many seconds (the store's clock):
    its job id was recorded at the claim, and its job may not have reached the queue yet.
    """
    queue = state.queue
    if queue is None or queue.state != QUEUED or (after > 0 and state.now - queue.since < after):
        return ""
    return queue.meta.job_id


def unreleased(lock: JobLock, exc: Exception) -> None:
    """A release that failed (the store away, or its reply lost).

    A delivery's locks (a worker's: its token travels with its job, shared with the job's
    redeliveries and retries) lapse with their lease and then go by the orphan rule: a late
    release could take what a retry of the job holds by then. A call's own locks (``run``,
    ``with``, ``uniqjob run``) are released again in the background until the store answers
    (``uniqjob._undo``; the same step twice changes nothing), and this process's next claim of
    the key may take them back meanwhile (see our_tokens). A "keep_last" call that waited behind
    the run was queued by that release: the retry pushes it to its queue, as the release would
    have, or drops it when it was an inline call's, which this process will not run (every later
    call of the key would coalesce into it).
    """
    if lock.delivered:
        log.error("could not release %s (%s); its run lock lapses one lease from now", lock.key, exc)
        return
    log.error("could not release %s (%s); trying again until the store answers", lock.key, exc)
    backend, key, token, attempt = lock.backend, lock.key, lock.token, lock._attempt
    keep, hand_on = lock.strategy == "until_expired", lock.hand_on

    def again() -> bool:
        pending = backend.finish(key, token, keep_queue=keep, attempt=attempt)  # it answers the same call
        if pending is None:
            return True
        try:
            handed = hand_on is not None and hand_on(key, pending)
        except Exception:  # its queue failed, not the store: left for the queue's gone check
            log.error("could not push the pending call of %s", key, exc_info=True)
            return True
        if not handed:
            log.warning("dropped the pending call of %s: its inline run's release failed", key)
            backend.dequeue(key, pending.token)
        return True

    undos.add(again, f"the locks of {key!r}", (token,), key)


def held_by(state: LockState, run_conflicts: bool) -> bool:
    """Would a claim conflict with ``state``? Orphans don't count (see JobLock.held)."""
    queue, run = state.queue, state.run
    run_alive = run is not None and not holder_is_dead(run.holder)
    if queue is not None and queue.state == QUEUED:
        return True
    if queue is not None:
        return run_alive
    return run_conflicts and run_alive
