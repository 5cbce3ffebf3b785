"""A job's enqueue, run and execute, each one readable path (the asyncio source of the twins).

The asyncio entry points of :class:`~uniqjob.job.UniqueJob` (``aenqueue``, ``arun``,
``aexecute``) call these with the store's async face, the sync ones the sync twin, which
``scripts/unasync.py`` generates from the asyncio source (edit that one, then run the script:
docs/internals.md). What a duplicate becomes is :mod:`uniqjob._conflicts`.

The concurrency glue (:mod:`uniqjob.concurrency._job`) is still made of steps
(:mod:`uniqjob._steps`): until it has twins of its own, it is driven from here (temporary).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from . import _callouts, _conflicts, _job_base, _joblock_async, _steps, settings
from .concurrency import _job as _concurrency
from .errors import BackendError, JobNotUnique
from .locks import QueueMeta
from .stores.aio import AsyncBackend

if TYPE_CHECKING:
    from .job import UniqueJob
    from .joblock import JobLock

__all__ = ["enqueue", "execute", "run", "settle"]


async def enqueue(
    cls: type[UniqueJob], lock: JobLock, store: AsyncBackend, args: Sequence[Any], kwargs: dict[str, Any]
) -> Any:
    """Take the queue lock and hand the job to its queue (none: run it now); the queue's handle."""
    queue = cls.unique_queue
    if queue is None:
        return await run(cls, lock, store, args, kwargs)
    settings.check_store(cls)
    # An until_expired lock outlives its job on purpose: its job being gone proves nothing.
    gone = None if lock.strategy == "until_expired" else queue.job_gone
    if cls.unique_strategy != "while_executing" and not await _joblock_async.acquire(lock, store, gone=gone):
        return await _callouts.acall_out(_conflicts.apply, cls, lock, args, kwargs)
    try:
        # Made once the lock is ours: a duplicate needs no id, and acquire() records none.
        job_id = _concurrency.job_id(cls, queue)
        if job_id:
            meta = lock.meta
            lock.meta = QueueMeta(meta.cls, meta.args, job_id)
        if cls.concurrency_limit is None:  # no slot to take: straight to the queue
            handle = await _callouts.acall_out(queue.push, cls, lock, tuple(args), dict(kwargs))
        else:
            push = _concurrency.push_steps(cls, queue, lock, args, kwargs)
            handle = await _steps.adrive(lock.backend, push)
    except BaseException:
        await _joblock_async.dequeue(lock, store)
        raise
    if lock.meta.job_id:
        # the job exists now: its queue may prove it gone from here on
        await _joblock_async.attach(lock, store)
    return handle


async def run(
    cls: type[UniqueJob], lock: JobLock, store: AsyncBackend, args: Sequence[Any], kwargs: dict[str, Any]
) -> Any:
    """Lock, perform in this process, release; perform's result, or None when the call is dropped."""
    _concurrency.mark_inline(lock)  # a concurrency "block" waits in this process
    while True:
        if lock.strategy == "until_executed" and cls.concurrency_limit is None:
            # the common case in one step: both locks at once
            if await _joblock_async.acquire(lock, store, run=True):
                return await _perform(cls, lock, store, args, kwargs, releasing=True)
            result = await _callouts.acall_out(_conflicts.apply, cls, lock, args, kwargs)
        elif cls.unique_strategy != "while_executing" and not await _joblock_async.acquire(lock, store):
            result = await _callouts.acall_out(_conflicts.apply, cls, lock, args, kwargs)
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
        body = _steps.called(partial(execute, cls, lock, store, args, kwargs, settle=settle))
        slot = _concurrency.execute_steps(cls, lock, args, kwargs, body, settle=settle)
        return await _steps.adrive(lock.backend, slot)
    try:
        await _joblock_async.start(lock, store)
    except JobNotUnique:
        run = lock.conflict.run if lock.conflict is not None else None
        if run is not None and run.token == lock.token:
            # This very job is running elsewhere (a broker delivered it twice): not
            # a duplicate call to reschedule or report, just a copy to skip.
            what = "%s: skipped a second delivery of %s, still running"
            _job_base.log.warning(what, cls.job_name(), lock.key)
            return None
        await _joblock_async.dequeue(lock, store)
        return await _callouts.acall_out(_conflicts.apply, cls, lock, args, kwargs)
    except Exception as exc:  # the store failed: give back what the call holds, then say so
        await _settle_failed_start(lock, store, settle, exc)
        raise
    except BaseException:  # cancelled with the start sent: it may be applied
        if _concurrency.is_inline(lock):
            lock.undo_start()
        raise
    if settle is None:
        return await _perform(cls, lock, store, args, kwargs, releasing=True)
    try:
        result = await _perform(cls, lock, store, args, kwargs, releasing=False)
    except BaseException as exc:
        await _callouts.acall_out(settle, exc, None)
        raise
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
        await _steps.adrive(lock.backend, _concurrency.undo_inline_steps(None, lock))
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
        await _steps.adrive(lock.backend, _concurrency.settle_slot_steps(lock, None))
        return
    delay = float(decision)
    try:
        await _joblock_async.requeue(lock, store, delay=delay)
    except BackendError:
        # Raising here would hide the job's own outcome; the lock lapses as an orphan instead.
        _job_base.settle_log.error("could not keep %s for its retry", lock.key, exc_info=True)
    # The retry comes whatever became of the lock: it runs in this slot.
    await _steps.adrive(lock.backend, _concurrency.settle_slot_steps(lock, delay))
