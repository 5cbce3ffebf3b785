"""A job's enqueue, run and execute, and a delivery's settling: each one readable path.

Written once, as asyncio code, for :class:`~uniqjob.job.UniqueJob`'s asyncio entry points; the sync
ones call the twin ``scripts/unasync.py`` makes of it (docs/internals.md). What a duplicate becomes
is :mod:`uniqjob._conflicts`; a concurrency limit's hooks are :mod:`uniqjob.concurrency`'s own twins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from . import _callouts, _coalesce, _conflicts, _job_base, _joblock_async, settings
from .concurrency import _job as _concurrency
from .concurrency import _job_async as _slots
from .errors import BackendError, ConfigurationError, JobNotUnique
from .locks import QueueMeta
from .stores.aio import AsyncBackend

if TYPE_CHECKING:
    from .job import UniqueJob
    from .joblock import JobLock
    from .queues import Queue

__all__ = ["enqueue", "execute", "next_call", "run", "settle"]


async def enqueue(
    cls: type[UniqueJob], lock: JobLock, store: AsyncBackend, args: Sequence[Any], kwargs: dict[str, Any]
) -> Any:
    """Take the queue lock and hand the job to its queue (none: run it now); the queue's handle."""
    queue = cls.unique_queue
    if queue is None:
        return await run(cls, lock, store, args, kwargs)
    settings.check_store(cls)
    # An until_expired lock outlives its job on purpose: its job being gone proves nothing.
    gone = None if lock.strategy == "until_expired" else partial(_job_gone, queue)
    # The job id chosen before the claim, which records it: one round trip, nothing attached
    # after the push. Its job is asked about only once its lock is older than suspect_after
    # (the push may not have landed before). Not with a concurrency limit: a parked call is in
    # no queue, and its id is made when it is pushed.
    after = queue.suspect_after if cls.concurrency_limit is None else None
    if after is not None:
        meta = lock.meta
        lock.meta = QueueMeta(meta.cls, meta.args, await _callouts.acall_out(queue.new_job_id), meta.call)
    if cls.unique_strategy != "while_executing" and not await _joblock_async.acquire(
        lock, store, gone=gone, gone_after=after
    ):
        return await _callouts.acall_out(_conflicts.apply, cls, lock, args, kwargs)
    try:
        # Else made once the lock is ours: a duplicate needs no id, and acquire() records none.
        job_id = "" if after is not None else _concurrency.job_id(cls, queue)
        if job_id:
            lock.meta = QueueMeta(lock.meta.cls, lock.meta.args, job_id)
        if lock.debounce is not None:  # due once the burst is over: see uniqjob._coalesce
            delay = lock.debounce[0]
            handle = await _callouts.acall_out(queue.push_in, cls, lock, tuple(args), dict(kwargs), delay)
        elif cls.concurrency_limit is None:  # no slot to take: straight to the queue
            handle = await _callouts.acall_out(queue.push, cls, lock, tuple(args), dict(kwargs))
        else:
            handle = await _slots.push(cls, queue, lock, args, kwargs)
    except BaseException:
        await store.dequeue(lock.key, lock.token)
        raise
    if lock.meta.job_id and after is None:
        # the job exists now: its queue may prove it gone from here on
        await _joblock_async.attach(lock, store)
    if lock.replaced:
        await _remove(queue, lock.replaced)
    return handle


async def _remove(queue: Queue, job_id: str) -> None:
    """Take a replaced call's job out of its queue; if that fails, its start is refused all the same."""
    try:
        await _callouts.acall_out(queue.remove, job_id)
    except Exception:
        _job_base.log.warning("could not remove replaced job %s from its queue", job_id, exc_info=True)


async def _delay(
    cls: type[UniqueJob], lock: JobLock, store: AsyncBackend, args: Sequence[Any], kwargs: dict[str, Any]
) -> None:
    """A debounced job started before it was due (calls came meanwhile): push it again, to start then."""
    queue, state = cls.unique_queue, lock.conflict
    assert queue is not None and state is not None and state.queue is not None and state.queue.due is not None
    delay = state.queue.due - state.now
    lock.meta = QueueMeta(lock.meta.cls, lock.meta.args, await _callouts.acall_out(queue.new_job_id))
    await _callouts.acall_out(queue.push_in, cls, lock, tuple(args), dict(kwargs), max(delay, 0.0))
    await _joblock_async.attach(lock, store)  # the lock names its job: the one pushed now


async def next_call(
    cls: type[UniqueJob], lock: JobLock, store: AsyncBackend, *, interrupted: bool = False
) -> None:
    """Push the call that waited behind ``lock``'s (policy "keep_last"), queued by its release.

    Whether the run returned or raised, that call is handed on. Inline (no queue), it runs here,
    and so does each one that waits behind it in turn; after a run that was cancelled or
    interrupted (``interrupted``), this process runs nothing more: the call is dropped, logged
    (left, every later call of the key would coalesce into it). Also called by a queue
    integration that releases the lock of a job it will never run (Celery, Huey, Dramatiq).
    """
    while (pending := lock.pending) is not None:
        lock.pending = None
        args, kwargs = _coalesce.decode(pending.meta.call)
        follower = _coalesce.follower(cls, lock.key, pending)
        queue = cls.unique_queue
        if queue is not None:
            try:
                await _callouts.acall_out(_coalesce.push_of(cls, follower, args, kwargs))
            except Exception:  # its lock stays queued: reclaimed once its queue proves the job gone
                _job_base.log.error("could not push the pending call of %s", lock.key, exc_info=True)
            return
        if interrupted:
            _job_base.log.warning("dropped the pending call of %s: its run was interrupted", lock.key)
            await store.dequeue(lock.key, pending.token)
            return
        # The call that waits behind an inline run lives in its queue lock: an autoexpire would
        # drop it under a long run. A dead holder's locks go by the orphan rule all the same.
        follower.ttl = None
        try:
            await _joblock_async.start(follower, store)
        except JobNotUnique:
            return  # taken over meanwhile: a later call runs instead
        except BaseException:  # it may be applied: left, its queued lock would refuse the key for good
            follower.undo_start()
            raise
        if follower.call:
            args, kwargs = _coalesce.decode(follower.call)
        await _performed(cls, follower, store, args, kwargs)
        lock = follower


def _job_gone(queue: Queue, job_id: str) -> Any:
    """``queue.job_gone(job_id)`` (maybe awaitable), unless this process asked about it a moment ago."""
    return queue.job_gone(job_id) if queue.may_ask(job_id) else False


async def run(
    cls: type[UniqueJob], lock: JobLock, store: AsyncBackend, args: Sequence[Any], kwargs: dict[str, Any]
) -> Any:
    """Lock, perform in this process, release; perform's result, or None when the call is dropped."""
    if lock.debounce is not None:
        raise ConfigurationError(
            f"{cls.job_name()}.unique_debounce delays its job in its queue: run() would perform it now;"
            " call enqueue()"
        )
    _concurrency.mark_inline(lock)  # a concurrency "block" waits in this process
    if lock.coalesce == "keep_last":
        lock.ttl = None  # see next_call
    queued = cls.unique_strategy != "while_executing"  # a queue lock to take first
    both = lock.strategy == "until_executed" and cls.concurrency_limit is None  # the usual: in one step
    while True:
        if queued and not await _joblock_async.acquire(lock, store, run=both):
            result = await _callouts.acall_out(_conflicts.apply, cls, lock, args, kwargs)
        elif both:
            result = await _performed(cls, lock, store, args, kwargs)
            await next_call(cls, lock, store)
            return result
        else:
            result = await execute(cls, lock, store, args, kwargs)
        if result is not _conflicts.RESCHEDULED:
            return result
        # inline, "reschedule" waits in this process and tries again
        await _job_base.apause(cls.unique_reschedule_delay)


async def execute(
    cls: type[UniqueJob],
    lock: JobLock,
    store: AsyncBackend,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    *,
    settle: Callable[[BaseException | None, Any], Any] | None = None,
) -> Any:
    """Worker side (and an inline call's): perform under the strategy's locks (see UniqueJob.execute)."""
    if cls.concurrency_limit is not None and not _concurrency.holding(lock):
        # a concurrency slot first; it wraps this very call (the slot is always released after)
        body = partial(execute, cls, lock, store, args, kwargs, settle=settle)
        return await _slots.execute(cls, lock, args, kwargs, body, settle=settle)
    try:
        await _joblock_async.start(lock, store)
    except JobNotUnique:
        state = lock.conflict
        assert state is not None
        run, queue_lock = state.run, state.queue
        if lock.coalesce and (queue_lock is None or queue_lock.token != lock.token):
            # Its call was replaced, or run by another job: nothing of it is left to run.
            _job_base.log.info("%s: skipped %s, whose call was replaced", cls.job_name(), lock.key)
            return None
        due = queue_lock.due if queue_lock is not None else None
        if due is not None and due > state.now and run is None:  # debounced, and not yet due
            await _delay(cls, lock, store, args, kwargs)
            return None
        if run is not None and run.token == lock.token:
            # This very job is running elsewhere (a broker delivered it twice): not
            # a duplicate call to reschedule or report, just a copy to skip.
            what = "%s: skipped a second delivery of %s, still running"
            _job_base.log.warning(what, cls.job_name(), lock.key)
            return None
        await store.dequeue(lock.key, lock.token)
        return await _callouts.acall_out(_conflicts.apply, cls, lock, args, kwargs)
    except Exception as exc:  # the store failed: give back what the call holds, then say so
        await _settle_failed_start(lock, store, settle, exc)
        raise
    except BaseException:  # cancelled with the start sent: it may be applied
        if _concurrency.is_inline(lock):
            lock.undo_start()
        raise
    if lock.call:  # "keep_last": the latest call's arguments, recorded while this one was queued
        args, kwargs = _coalesce.decode(lock.call)
    result = await _performed(cls, lock, store, args, kwargs, settle=settle)
    await next_call(cls, lock, store)
    return result


async def _performed(
    cls: type[UniqueJob],
    lock: JobLock,
    store: AsyncBackend,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    *,
    settle: Callable[[BaseException | None, Any], Any] | None = None,
) -> Any:
    """Perform under the locks taken; then release them, or, with ``settle``, let the delivery
    settle them by how it ended. If perform raised, the call that waited behind it is handed on
    first (see next_call), then the error goes on."""
    try:
        result = await _perform(cls, lock, store, args, kwargs, releasing=settle is None)
    except BaseException as exc:
        if settle is not None:
            await _callouts.acall_out(settle, exc, None)
        await next_call(cls, lock, store, interrupted=not isinstance(exc, Exception))
        raise
    if settle is not None:
        await _callouts.acall_out(settle, None, result)
    return result


async def _perform(
    cls: type[UniqueJob],
    lock: JobLock,
    store: AsyncBackend,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    *,
    releasing: bool,
) -> Any:
    """Perform under the locks already taken (as ``with lock.running(started=True, release=...)``)."""
    await _joblock_async.hold(lock, store, started=True, releasing=releasing)
    try:
        result = await _callouts.acall_out(cls.invoke, args, kwargs)
    finally:
        await _joblock_async.unhold(lock, store, releasing=releasing)
    return result


async def _settle_failed_start(
    lock: JobLock,
    store: AsyncBackend,
    settle: Callable[[BaseException | None, Any], Any] | None,
    exc: Exception,
) -> None:
    """``lock.start()`` failed: drop an inline call's queued lock; settle a delivery as a failed one.

    Left behind, an inline call's queued lock (no queue can prove it gone, no
    expiry unless autoexpire) would refuse its key for good.
    """
    if _concurrency.is_inline(lock):
        await _slots.undo_inline(None, lock)
    elif settle is not None:
        await _callouts.acall_out(settle, exc, None)
    else:
        await _joblock_async.release(lock, store)


async def settle(lock: JobLock, store: AsyncBackend, decision: float | str | None) -> None:
    """A queue's verdict on a delivery: release (None), keep it queued for a retry in n seconds,
    or nothing ("keep": already settled). See :func:`uniqjob.integrations.settle`."""
    if decision == "keep":
        return
    if decision is None:
        await _joblock_async.release(lock, store)  # logs its own store failures
        await _slots.settle_slot(lock, None)
        return
    delay = float(decision)
    try:
        await _joblock_async.requeue(lock, store, delay=delay)
    except BackendError:
        # Raising here would hide the job's own outcome; the lock lapses as an orphan instead.
        _job_base.settle_log.error("could not keep %s for its retry", lock.key, exc_info=True)
    # The retry comes whatever became of the lock: it runs in this slot.
    await _slots.settle_slot(lock, delay)
