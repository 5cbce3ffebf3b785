"""The job lock's operations on the store, each one readable path.

Written once, as asyncio code, for :class:`~uniqjob.joblock.JobLock`'s asyncio methods; its sync
methods call the twin ``scripts/unasync.py`` makes of it (docs/internals.md). The rules without
I/O are in :mod:`uniqjob._joblock_base`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from ._callouts import acall_out
from ._joblock_base import (
    AT_START,
    ATTEMPTS,
    claim_meta,
    counted,
    current,
    dead_tokens,
    gone_job,
    held_by,
    log,
    our_tokens,
    undo_claim,
    unreleased,
)
from ._undo import undos
from .errors import BackendError, CorruptRecordError, JobNotUnique
from .heartbeat import deadline, heartbeat
from .locks import LockState, RunClaim, local_holder
from .stores.aio import AsyncBackend, completed

if TYPE_CHECKING:
    from .joblock import JobLock

__all__ = ["acquire", "attach", "enter", "held", "hold", "release", "requeue", "start", "unhold"]


async def acquire(
    lock: JobLock,
    store: AsyncBackend,
    *,
    run: bool = False,
    gone: Callable[[str], Any] | None = None,
    gone_after: float | None = None,
) -> bool:
    """Take the queue lock (with ``run``, the run lock too, in one step); False on conflict.

    ``gone_after`` (seconds): the claim records ``lock.meta.job_id``, chosen before it, and a
    conflicting queued lock's job is asked about (``gone``) only once that lock is this old.
    """
    claim = RunClaim(local_holder(), lock.lease, lock._attempt) if run else None
    meta = claim_meta(lock, with_job_id=gone_after is not None)
    candidates = lock.candidate_keys()
    if undos.pending:  # a failed release of this process on one of the keys: settled first
        await undos.asettle(candidates)
    # A run claim (inline) replaces nothing: the replaced call's run may still be under way.
    coalesce = "" if run and lock.coalesce == "replace" else lock.coalesce
    for candidate in candidates:
        # Only the last candidate key's refusal is a duplicate (see Backend.duplicates), counted once.
        count, before = candidate == candidates[-1], None
        for _ in range(ATTEMPTS):
            lock._granted_at = heartbeat.clock()
            try:
                state = await store.claim(
                    candidate, lock.token, meta=meta, ttl=lock.ttl, run=claim, count=count, counted=before,
                    coalesce=coalesce, debounce=lock.debounce,
                )  # fmt: skip
            except CorruptRecordError:
                raise  # the store answered: nothing was applied
            except BaseException:  # the store failed, or the caller was cancelled: it may be applied
                undo_claim(lock, candidate)
                raise
            if state is None or state.coalesced == "replaced":
                lock.key, lock.conflict, lock._key_fixed = candidate, None, True
                if claim is not None:
                    lock.fence = claim.fence
                if state is not None and state.queue is not None:
                    lock.replaced = state.queue.meta.job_id  # ours now: its queue drops that job
                return True
            lock.conflict = state
            state.refused = "both" if run else "queue"
            if state.nothing_to_reclaim_yet(gone_after) and not undos.pending:
                break  # the usual duplicate: queued, nothing running, no job a queue could prove gone yet
            if not (
                await _reclaim_ours(store, state)
                or await _reclaim_dead(store, state)
                or await _reclaim_gone(lock, store, state, gone, gone_after or 0.0)
            ):
                break
            before = counted(lock, state, count, before)
    return False


async def _reclaim_ours(store: AsyncBackend, state: LockState) -> bool:
    """Remove a lock left by one of this process's own failed steps (see uniqjob._undo); True if any."""
    tokens = our_tokens(state)
    if tokens is None:
        return False
    await store.reclaim(state.key, *tokens)
    return True  # claim again, even if the background undo removed them first


async def _reclaim_dead(store: AsyncBackend, state: LockState) -> bool:
    """Reclaim the locks of a holder that is provably dead; True if worth retrying."""
    tokens = dead_tokens(state)
    if tokens is None:
        return False
    await store.reclaim(state.key, *tokens)
    return True


async def _reclaim_gone(
    lock: JobLock, store: AsyncBackend, state: LockState, gone: Callable[[str], Any] | None, after: float
) -> bool:
    """Drop a queued lock whose job its queue proves gone for good (``gone(job_id)``); True if dropped."""
    job_id = gone_job(state, after)
    if gone is None or not job_id or not await acall_out(gone, job_id):
        return False
    log.warning("reclaiming lock %s: its job %s is gone from the queue", state.key, job_id)
    assert state.queue is not None
    if not await store.dequeue(state.key, state.queue.token):
        return False
    lock.gone_tokens.append(state.queue.token)
    return True


async def start(lock: JobLock, store: AsyncBackend) -> None:
    """Take what the strategy holds while perform runs; raise :class:`JobNotUnique` if held."""
    mode = AT_START[lock.strategy]
    if mode is None:
        await store.dequeue(lock.key, None if lock.adopt else lock.token)
        return
    if lock.coalesce and mode == "run":
        mode = "own"  # a call replaced or taken over never runs (its refusal is no duplicate)
    claim = RunClaim(local_holder(), lock.lease, lock._attempt)
    candidates = lock.candidate_keys()
    for candidate in candidates:
        count, before = candidate == candidates[-1], None
        for _ in range(ATTEMPTS):
            lock._granted_at = heartbeat.clock()
            # A start that fails is not undone here: the token is its job's, and a second
            # delivery may re-take the run lock with it. If it was applied, the lease lapses
            # and its queue lock is then an orphan; the job layer drops an inline call's
            # queued lock.
            state = await store.start(
                candidate, lock.token, run=claim, meta=lock.meta, ttl=lock.ttl, adopt=lock.adopt,
                queue_lock=mode, count=count and mode != "own", counted=before,
            )  # fmt: skip
            if state is None:
                lock.key, lock.conflict, lock._key_fixed = candidate, None, True
                lock.fence, lock.call = claim.fence, claim.call
                return
            lock.conflict = state
            state.refused = "run"
            if not await _reclaim_dead(store, state):
                break
            before = counted(lock, state, count, before)
    assert lock.conflict is not None
    raise JobNotUnique(lock.key, lock.conflict.describe())


async def hold(lock: JobLock, store: AsyncBackend, *, started: bool = False, releasing: bool = True) -> None:
    """Begin :meth:`JobLock.running`: start (unless ``started``), and the heartbeat.

    ``releasing``: the locks go when the body ends (else the caller settles them).
    """
    if not started:
        await start(lock, store)
    if AT_START[lock.strategy] is None:
        return
    backend, key, lease = lock.backend, lock.key, lock.lease
    # (a second delivery of this job, the same token, renews as another attempt)
    renew = partial(backend.renew, key, lock.token, lease, lock._attempt)
    granted = lock._granted_at
    if granted is not None and heartbeat.clock() >= deadline(granted, lease):
        await _confirm(lock, store, releasing)
    # The heartbeat renews through the sync backend on its own threads, for async holders
    # too: an event loop kept busy by other tasks cannot starve it.
    lock._beat = heartbeat.start(
        renew, lease / 3, key, lease=lease, confirmed=lock._granted_at, on_lost=lock._lost, group=backend
    )
    lock._outer = current.set(lock)


async def unhold(lock: JobLock, store: AsyncBackend, *, releasing: bool = True) -> None:
    """End :meth:`JobLock.running`: the heartbeat stops and (with ``releasing``) the locks go."""
    outer, lock._outer = lock._outer, None
    if outer is not None:
        current.reset(outer)
    if lock._beat is not None:
        lock._beat.cancel()
    if releasing:
        await release(lock, store)


async def _confirm(lock: JobLock, store: AsyncBackend, releasing: bool) -> None:
    """The grant's reply came too late to count on its lease: renew once before perform, or give up.

    (A claim sent just before a stall is granted when the store wakes, and
    its reply may arrive after the holder's own deadline.) If the renewal
    is not confirmed, the locks go (unless the caller settles them) and
    :class:`BackendError` says why: perform does not start.
    """
    sent = heartbeat.clock()
    try:
        if not await store.renew(lock.key, lock.token, lock.lease, lock._attempt):
            raise BackendError(
                f"the lock {lock.key!r} was granted too late to rely on and was gone when renewed; "
                "the job did not run",
                lock.backend.name,
            )
    except GeneratorExit:
        raise
    except BaseException:  # gone, the store failed, or the caller was cancelled: perform does not start
        if releasing:
            await release(lock, store)
        raise
    lock._granted_at = sent


async def enter(lock: JobLock, store: AsyncBackend) -> JobLock:
    """Take what the strategy holds while its job runs, as ``Job.run()`` does; JobNotUnique if held."""
    both = lock.strategy == "until_executed"  # both locks in one claim
    if lock.strategy != "while_executing" and not await acquire(lock, store, run=both):
        assert lock.conflict is not None
        raise JobNotUnique(lock.key, lock.conflict.describe())
    try:
        if not both:
            await start(lock, store)
    except JobNotUnique:
        await store.dequeue(lock.key, lock.token)
        raise
    except GeneratorExit:
        raise
    except BaseException:  # the start failed or was cancelled with its request sent: it may be applied
        lock.undo_start()
        raise
    await hold(lock, store, started=True)  # (a late grant it cannot confirm releases the locks)
    return lock


async def release(lock: JobLock, store: AsyncBackend) -> None:
    """Release what is still ours (see :meth:`JobLock.release`); never raises for the store."""
    key, token, keep, attempt = lock.key, lock.token, lock.strategy == "until_expired", lock._attempt
    try:
        lock.pending = await store.finish(key, token, keep_queue=keep, attempt=attempt)
    except Exception as exc:  # whatever the client raised: see JobLock.release()
        unreleased(lock, exc)
    except GeneratorExit:
        raise
    except BaseException:
        # Cancelled (asyncio) or interrupted while the release was under way: it may not
        # have been sent, and then its locks would refuse the key for a whole lease. So it
        # is made to its end before the cancellation goes on, however often the task is
        # cancelled meanwhile; made twice, it changes nothing more (token- and
        # attempt-checked: a live delivery of the same job is left alone).
        try:
            lock.pending = await completed(store.finish(key, token, keep_queue=keep, attempt=attempt))
        except Exception as exc:
            unreleased(lock, exc)
        raise


async def requeue(lock: JobLock, store: AsyncBackend, *, delay: float = 0.0) -> bool:
    """Keep the key for a job that will run again (a retry); False if it is no longer ours."""
    if lock._beat is not None:
        lock._beat.cancel()
    if lock.strategy in ("while_executing", "until_expired"):
        # nothing to hold while waiting / a queue lock that perform never touches
        await store.finish(lock.key, lock.token, keep_queue=True, attempt=lock._attempt)
        return True
    ttl = None if lock.ttl is None else lock.ttl + delay
    if await store.requeue(lock.key, lock.token, meta=lock.meta, ttl=ttl, attempt=lock._attempt):
        return True
    log.warning("%s was taken by another enqueue while its job waited for a retry", lock.key)
    return False


async def attach(lock: JobLock, store: AsyncBackend) -> bool:
    """Record ``meta.job_id`` in the queue lock, once the queue holds the job; False if not ours."""
    if not lock.meta.job_id:
        return False
    return await store.attach(lock.key, lock.token, lock.meta.job_id)


async def held(lock: JobLock, store: AsyncBackend, *, run_conflicts: bool = False) -> bool:
    """Would a claim of this key conflict now? Orphans don't count; every one of its keys must be held."""
    for candidate in lock.candidate_keys():
        state = await store.read(candidate)
        if not held_by(state, run_conflicts):
            return False
    return True
