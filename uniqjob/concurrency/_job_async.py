"""The concurrency hooks that ``UniqueJob`` calls, written once, for asyncio (see :mod:`._job`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .._callouts import acall_out
from .._undo import undos
from ..errors import ConcurrencyLimitExceeded
from ..locks import local_holder
from ..stores.semaphores import Park
from . import _job as base
from ._job import ABody, Parked, Settle, log, semaphore_of
from ._semaphore_base import Hold
from .semaphore import Semaphore

if TYPE_CHECKING:
    from ..job import Queue, UniqueJob
    from ..joblock import JobLock


async def push(
    cls: type[UniqueJob], queue: Queue, lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]
) -> Any:
    """Enqueue side: take a slot and push, or park the call, or refuse it; return the handle.

    Runs with the uniqueness lock already held, for a class with a concurrency limit. Returns the
    queue's handle, a :class:`Parked` or None (discarded). The queue's push is awaited on the
    asyncio path, as arq's is.
    """
    semaphore = semaphore_of(cls, args, kwargs)
    park = base.queue_park(cls, lock, args, kwargs)  # unstorable arguments fail here, at every enqueue
    for gone in lock.gone_tokens:
        # the queue proved that job gone for good (the lock was reclaimed from it): so is
        # its slot, if it held one on this key. Freed first, so its place is promoted in order.
        await semaphore.arelease(gone)
    delay = queue.pending_delay()
    try:
        outcome = await semaphore.aacquire(
            lock.token, running=False, park=park, args=lock.meta.args, delay=delay
        )
    except BaseException:
        # Its reply may be what was lost: a slot or a place taken for a job never pushed goes
        # now (token-checked), not a lease later. The caller drops the uniqueness lock.
        await semaphore.aabandon(lock.token)
        raise
    if outcome.status == "taken":
        if not lock.meta.job_id:
            lock.meta = replace(lock.meta, job_id=queue.new_job_id())
        try:
            return await acall_out(queue.push, cls, lock, tuple(args), dict(kwargs))
        except BaseException:
            await semaphore.arelease(lock.token)
            raise
    if outcome.status == "parked":
        where = (cls.job_name(), semaphore.key, outcome.position)
        log.info("%s parked: concurrency key %s is at its limit (place %d)", *where)
        return Parked(semaphore.key, lock.token, outcome.position)
    return await _refuse(cls, semaphore, lock)


async def _refuse(cls: type[UniqueJob], semaphore: Semaphore, lock: JobLock) -> None:
    """The key is full and the call is not parked: drop its uniqueness lock, then raise or discard."""
    await lock.adequeue()
    if cls.concurrency_on_conflict == "raise":
        raise ConcurrencyLimitExceeded(semaphore.key, semaphore.limit)
    log.info(
        "%s discarded: concurrency key %s is at its limit of %d",
        cls.job_name(),
        semaphore.key,
        semaphore.limit,
    )


async def settle_slot(lock: JobLock, retry_in: float | None) -> None:
    """A queue's verdict on the delivery running under ``lock``: its slot goes, or stays for a retry.

    ``retry_in`` seconds: the queue runs the job again (same token), so the
    slot is kept for it, reserved, from now on; call this before the retry is
    sent. None: the job is done for good, and the slot is released when the
    delivery ends (as it is by default; this undoes an earlier keep whose
    retry was never sent). Nothing happens outside a delivery holding a slot.
    """
    hold = base.held_by(lock)
    if hold is None:
        return
    if retry_in is None:
        hold.kept = False  # no retry is coming after all
    elif not hold.kept:
        await hold.semaphore.akeep(hold, retry_in)


async def execute(
    cls: type[UniqueJob],
    lock: JobLock,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    body: ABody,
    *,
    settle: Settle | None = None,
) -> Any:
    """Perform side: run ``body`` (the uniqueness locks and perform) holding a slot; release it after.

    On a worker the slot was taken at enqueue: the job runs in it, unless a
    copy of it runs or ran already (a duplicate delivery: skipped). If its
    lease lapsed before it started, it takes a slot again like a new call.
    Inline, the call takes a slot now; under "block" it parks and waits here.

    A slot step that fails (the store is away, denies the keys, or holds a
    corrupt record) undoes what the call took before it, and its error
    reaches the caller: inline, the call's queued uniqueness lock is dropped
    and any slot or place the step may have taken is given up; on a worker,
    the delivery is settled as a failed one (``settle``, given by a queue
    that may retry it; else the lock is released). A task cancelled while it
    waits for its turn is undone the same way.
    """
    inline = base.is_inline(lock)
    semaphore: Semaphore | None = None
    try:
        semaphore = semaphore_of(cls, args, kwargs)
        if inline:
            go = await _take_inline(cls, semaphore, lock)
        else:
            go = await _take_delivered(cls, semaphore, lock, args, kwargs)
        if not go:
            return None
        hold = semaphore.hold(lock.token)  # a heartbeat that cannot start must not keep the slot
    except ConcurrencyLimitExceeded:
        raise  # a refusal, not a failure: the call's lock was dropped on the way
    except BaseException as exc:
        if inline:
            await undo_inline(semaphore, lock)
        else:
            await _undo_delivery(semaphore, lock, settle, exc)
        raise
    try:
        with base.held(lock, hold):
            return await body()
    finally:
        await semaphore.aunhold(lock.token, hold)


async def _take_inline(cls: type[UniqueJob], semaphore: Semaphore, lock: JobLock) -> bool:
    """Take a running slot for an inline call, waiting in line under "block"; False: do not run it."""
    park = (
        Park("inline", holder=local_holder(), lease=semaphore.lease)
        if cls.concurrency_on_conflict == "block"
        else None
    )
    outcome = await semaphore.aacquire(lock.token, running=True, park=park, args=lock.meta.args)
    if outcome.status == "parked":
        return await _wait_turn(cls, semaphore, lock)
    if outcome.status == "full":
        await _refuse(cls, semaphore, lock)
        return False
    return True


async def _wait_turn(cls: type[UniqueJob], semaphore: Semaphore, lock: JobLock) -> bool:
    """Wait in line for the parked inline call; True once it holds a running slot."""
    timeout = cls.concurrency_wait_timeout
    waited = await semaphore.await_(lock.token, None if timeout is None else float(timeout))
    if waited == "run":
        return True
    await lock.adequeue()
    if waited == "timeout":
        raise ConcurrencyLimitExceeded(semaphore.key, semaphore.limit, float(timeout or 0))
    why = (
        "an operator discarded it"
        if waited == "discarded"
        else f"this process did not poll for a whole lease ({semaphore.lease:.0f}s), so it was"
        " taken for a dead waiter's"
    )
    log.warning("%s not run: its place in line on %s is gone: %s", cls.job_name(), semaphore.key, why)
    return False


async def _take_delivered(
    cls: type[UniqueJob], semaphore: Semaphore, lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]
) -> bool:
    """Start a delivered job's slot (taking one again if it lapsed); False: skip this delivery."""
    token = lock.token
    outcome = await semaphore.astart(token)
    if outcome.status in ("busy", "done", "parked"):
        state = {"busy": "running", "done": "done", "parked": "parked"}[outcome.status]
        log.info("%s skipped: a copy of job %s on %s is %s", cls.job_name(), token, semaphore.key, state)
        base.detach(lock)
        return False
    if outcome.status == "missing":
        where = (cls.job_name(), token, semaphore.key)
        log.info("%s: slot of job %s on %s lapsed before it started; taking one again", *where)
        park = base.queue_park(cls, lock, args, kwargs)
        outcome = await semaphore.aacquire(token, running=True, park=park, args=lock.meta.args)
        if outcome.status == "parked":
            base.detach(lock)  # pushed again when its turn comes
            return False
        if outcome.status == "full":
            await _refuse(cls, semaphore, lock)
            return False
    return True


async def undo_inline(semaphore: Semaphore | None, lock: JobLock) -> None:
    """An inline call's slot step failed: drop its queued uniqueness lock, then what the step took.

    The uniqueness lock goes first, as after a perform. An inline call has no
    queue that could ever prove it gone, and no expiry unless autoexpire is
    set: left behind, it would refuse the key for good.
    """
    try:
        await lock.adequeue()  # token-checked: only this call's lock, and only while it is queued
    except Exception as exc:
        log.warning("could not drop the lock of %s yet (%s); retrying until the store answers", lock.key, exc)
        undos.add(lock.dequeue, f"queue lock of {lock.key}", (lock.token,))
    if semaphore is not None:
        await semaphore.aabandon(lock.token)


async def _undo_delivery(
    semaphore: Semaphore | None, lock: JobLock, settle: Settle | None, exc: BaseException
) -> None:
    """A delivery's slot step failed: settle it as a failed delivery, the slot following the lock.

    With ``settle`` the queue decides, as for a failed perform: released for
    good, or kept for its retry (the slot too, if it ran here). Without it the
    lock is released, as a worker's ``execute`` does after any failed perform.
    """
    if settle is None:
        await lock.arelease()
        if semaphore is not None:
            await semaphore.arelease(lock.token)
        return
    hold = Hold(semaphore, lock.token, None) if semaphore is not None else None
    with base.held(lock, hold):
        try:
            await acall_out(settle, exc, None)
        except Exception:
            log.error("could not settle the failed delivery of %s", lock.key, exc_info=True)
    if hold is not None and not hold.kept:
        await hold.semaphore.arelease(lock.token)
