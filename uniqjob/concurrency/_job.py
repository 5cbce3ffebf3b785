"""Concurrency limits on job classes: the hooks that ``UniqueJob`` calls.

``job.py`` calls four hooks, each a line: :func:`check` (from ``_settings``,
where a class's settings are checked and resolved) when a class is defined,
:func:`push` where ``enqueue`` hands a job to its queue, and
:func:`mark_inline` and :func:`execute` where a job is performed. Uniqueness
comes first (a duplicate is refused at once, it never waits in line), then the
slot; the slot is released after the uniqueness locks, so a promoted job never
meets its predecessor's run lock. Queue integrations call :func:`settle_slot`
with their verdict on a delivery: a job the queue retries keeps its slot.
A step that fails undoes, token-checked, what the call took before it (a
failed slot step never strands the call's uniqueness lock; a failed
uniqueness step frees the slot), and its error reaches the caller.

Each hook is written once, as steps (:mod:`uniqjob._steps`), and yielded
from the job layer's own: the sync API drives them by calling the stores, the
asyncio API awaits them (a "block" is an awaited wait in the event loop, a
promoted call pushed to an async queue such as arq's is awaited).
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .._steps import Steps, adrive, drive, twin_of
from .._undo import undos
from ..errors import BackendError, ConcurrencyLimitExceeded
from ..locks import local_holder, new_token
from ..stores.semaphores import Park, Promotion, SemaphoreStore
from ..stores.semaphores_aio import AsyncSemaphores
from ._background import background
from ._settings import check, semaphore_of
from .codec import decode_call, encode_call
from .semaphore import Hold, Semaphore, on_promotion

if TYPE_CHECKING:
    from ..job import Queue, UniqueJob
    from ..joblock import JobLock

__all__ = [
    "Parked",
    "check",
    "execute",
    "execute_steps",
    "free",
    "push",
    "push_steps",
    "semaphore_of",
    "settle_slot",
    "settle_slot_steps",
]

_NONE: dict[str, Any] = {}  # a step's keyword arguments: none

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Parked:
    """What ``enqueue`` returns for a job parked behind a concurrency limit.

    It is pushed to its queue when a slot frees up (oldest first); ``position``
    was its place in line when it parked.
    """

    key: str
    token: str
    position: int


def _refuse(cls: type[UniqueJob], semaphore: Semaphore, lock: JobLock) -> Steps[None]:
    """The key is full and the call is not parked: drop its uniqueness lock, then raise or discard."""
    yield from lock.dequeue_steps()
    if cls.concurrency_on_conflict == "raise":
        raise ConcurrencyLimitExceeded(semaphore.key, semaphore.limit)
    log.info(
        "%s discarded: concurrency key %s is at its limit of %d",
        cls.job_name(),
        semaphore.key,
        semaphore.limit,
    )


def _queue_park(
    cls: type[UniqueJob], lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]
) -> Park | None:
    if cls.concurrency_on_conflict != "block":
        return None
    return Park("queue", encode_call(cls, tuple(args), dict(kwargs), lock.key))


def job_id(cls: type[UniqueJob], queue: Queue) -> str:
    """The job id recorded in the uniqueness lock at enqueue.

    A call that may park has none: until promoted it is in no queue, and a
    queue asked about it would rightly say it is gone, freeing its lock.
    """
    if cls.concurrency_limit is not None and cls.concurrency_on_conflict == "block":
        return ""
    return queue.new_job_id()


def push(
    cls: type[UniqueJob], queue: Queue, lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]
) -> Any:
    """Enqueue side: take a slot and push, or park the call, or refuse it; return the handle.

    Runs with the uniqueness lock already held. Returns the queue's handle, a
    :class:`Parked` or None (discarded).
    """
    return drive(lock.backend, push_steps(cls, queue, lock, args, kwargs))


def push_steps(
    cls: type[UniqueJob], queue: Queue, lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]
) -> Steps[Any]:
    """The steps of :func:`push` (the queue's ``push`` awaited on the async path, as arq's is)."""
    if cls.concurrency_limit is None:
        return (yield (queue.push, (cls, lock, tuple(args), dict(kwargs)), _NONE))
    semaphore = semaphore_of(cls, args, kwargs)
    park = _queue_park(cls, lock, args, kwargs)  # unstorable arguments fail here, at every enqueue
    for gone in lock.gone_tokens:
        # the queue proved that job gone for good (the lock was reclaimed from it): so is
        # its slot, if it held one on this key. Freed first, so its place is promoted in order.
        yield twin_of(semaphore.release, semaphore.arelease, gone)
    delay = queue.pending_delay()
    try:
        outcome = yield twin_of(
            semaphore.acquire,
            semaphore.aacquire,
            lock.token,
            running=False,
            park=park,
            args=lock.meta.args,
            delay=delay,
        )
    except BaseException:
        # Its reply may be what was lost: a slot or a place taken for a job never pushed goes
        # now (token-checked), not a lease later. The caller drops the uniqueness lock.
        yield twin_of(semaphore.abandon, semaphore.aabandon, lock.token)
        raise
    if outcome.status == "taken":
        if not lock.meta.job_id:
            lock.meta = replace(lock.meta, job_id=queue.new_job_id())
        try:
            return (yield (queue.push, (cls, lock, tuple(args), dict(kwargs)), _NONE))
        except BaseException:
            yield twin_of(semaphore.release, semaphore.arelease, lock.token)
            raise
    if outcome.status == "parked":
        where = (cls.job_name(), semaphore.key, outcome.position)
        log.info("%s parked: concurrency key %s is at its limit (place %d)", *where)
        return Parked(semaphore.key, lock.token, outcome.position)
    return (yield from _refuse(cls, semaphore, lock))


# Calls performed by this process in place of a queue: their "block" waits here.
_inline: weakref.WeakSet[JobLock] = weakref.WeakSet()
# The slots this context holds, by id of their lock: execute() re-entered from inside the slot
# passes straight through, and settle_slot() finds the slot of the delivery it settles.
_NONE_HELD: Mapping[int, Hold] = MappingProxyType({})
_holding: ContextVar[Mapping[int, Hold]] = ContextVar("uniqjob_concurrency_holding", default=_NONE_HELD)


def _detach(lock: JobLock) -> None:
    """Make a skipped delivery's lock hold nothing, so that settling it frees nothing.

    Its token is the job's, shared with the copy that runs (or with the parked
    call): a queue integration that releases or requeues this delivery's lock
    afterwards must not touch theirs.
    """
    lock.token = new_token()


def mark_inline(lock: JobLock) -> None:
    """Say that ``lock``'s call is performed by this process (``run()``, or enqueue without a queue)."""
    _inline.add(lock)


def is_inline(lock: JobLock) -> bool:
    """True if ``lock``'s call is performed by this process (see :func:`mark_inline`)."""
    return lock in _inline


def holding(lock: JobLock) -> bool:
    """True while this context holds ``lock``'s slot (so the hook has already run)."""
    return id(lock) in _holding.get()


def settle_slot(lock: JobLock, retry_in: float | None) -> None:
    """A queue's verdict on the delivery running under ``lock``: its slot goes, or stays for a retry.

    ``retry_in`` seconds: the queue runs the job again (same token), so the
    slot is kept for it, reserved, from now on; call this before the retry is
    sent. None: the job is done for good, and the slot is released when the
    delivery ends (as it is by default; this undoes an earlier keep whose
    retry was never sent). Nothing happens outside a delivery holding a slot.
    """
    hold = _holding.get().get(id(lock))
    if hold is None:
        return
    if retry_in is None:
        hold.unkeep()
    elif not hold.kept:
        hold.semaphore.keep(hold, retry_in)


def settle_slot_steps(lock: JobLock, retry_in: float | None) -> Steps[None]:
    """The steps of :func:`settle_slot`."""
    hold = _holding.get().get(id(lock))
    if hold is None:
        return
    if retry_in is None:
        hold.unkeep()
    elif not hold.kept:
        yield twin_of(hold.semaphore.keep, hold.semaphore.akeep, hold, retry_in)


def free(cls: type[UniqueJob], token: str, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Release the slot of job ``token`` (a call of ``cls`` with these arguments) that will never run.

    For a queue that learns a job is gone for good (revoked, expired): its
    slot is freed at once, and the oldest parked call promoted into it,
    instead of lapsing with its lease. False if it held none.
    """
    if cls.concurrency_limit is None:
        return False
    return semaphore_of(cls, args, kwargs).release(token)


#: A queue's settling of a delivery (see ``UniqueJob.execute``): given how it ended, release or keep.
#: An async queue's (arq's) returns an awaitable, awaited on the asyncio path.
Settle = Callable[[BaseException | None, Any], Any]


def execute(
    cls: type[UniqueJob],
    lock: JobLock,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    body: Callable[[], Any],
    *,
    settle: Settle | None = None,
) -> Any:
    """Perform side: run ``body`` (the uniqueness locks and perform) holding a slot; release it after.

    The steps of :func:`execute_steps`, driven synchronously, with ``body`` called as their body.
    """
    return drive(lock.backend, execute_steps(cls, lock, args, kwargs, _called(body), settle=settle))


def _called(body: Callable[[], Any]) -> Steps[Any]:
    return (yield (body, (), _NONE))


def execute_steps(
    cls: type[UniqueJob],
    lock: JobLock,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    body: Steps[Any],
    *,
    settle: Settle | None = None,
) -> Steps[Any]:
    """Perform side: run ``body`` (the locks and perform, as steps) holding a slot; release it after.

    On a worker the slot was taken at enqueue: the job runs in it, unless a
    copy of it runs or ran already (a duplicate delivery: skipped). If its
    lease lapsed before it started, it takes a slot again like a new call.
    Inline, the call takes a slot now; under "block" it parks and waits here
    (on the asyncio path an awaited wait: the event loop runs on).

    A slot step that fails (the store is away, denies the keys, or holds a
    corrupt record) undoes what the call took before it, and its error
    reaches the caller: inline, the call's queued uniqueness lock is dropped
    and any slot or place the step may have taken is given up; on a worker,
    the delivery is settled as a failed one (``settle``, given by a queue
    that may retry it; else the lock is released). A task cancelled while it
    waits for its turn is undone the same way.
    """
    inline = lock in _inline
    semaphore: Semaphore | None = None
    try:
        semaphore = semaphore_of(cls, args, kwargs)
        if inline:
            go = yield from _take_inline(cls, semaphore, lock)
        else:
            go = yield from _take_delivered(cls, semaphore, lock, args, kwargs)
        if not go:
            body.close()
            return None
        hold = semaphore.hold(lock.token)  # a heartbeat that cannot start must not keep the slot
    except ConcurrencyLimitExceeded:
        body.close()
        raise  # a refusal, not a failure: the call's lock was dropped on the way
    except BaseException as exc:
        body.close()
        if inline:
            yield from undo_inline_steps(semaphore, lock)
        else:
            yield from _undo_delivery(semaphore, lock, settle, exc)
        raise
    try:
        entered = _holding.set({**_holding.get(), id(lock): hold})
        try:
            return (yield from body)
        finally:
            _holding.reset(entered)
    finally:
        yield twin_of(semaphore.unhold, semaphore.aunhold, lock.token, hold)


def _take_inline(cls: type[UniqueJob], semaphore: Semaphore, lock: JobLock) -> Steps[bool]:
    """Take a running slot for an inline call, waiting in line under "block"; False: do not run it."""
    park = (
        Park("inline", holder=local_holder(), lease=semaphore.lease)
        if cls.concurrency_on_conflict == "block"
        else None
    )
    outcome = yield twin_of(
        semaphore.acquire, semaphore.aacquire, lock.token, running=True, park=park, args=lock.meta.args
    )
    if outcome.status == "parked":
        return (yield from _wait_turn(cls, semaphore, lock))
    if outcome.status == "full":
        yield from _refuse(cls, semaphore, lock)
        return False
    return True


def _wait_turn(cls: type[UniqueJob], semaphore: Semaphore, lock: JobLock) -> Steps[bool]:
    """Wait in line for the parked inline call; True once it holds a running slot."""
    timeout = cls.concurrency_wait_timeout
    waited = yield twin_of(
        semaphore.wait, semaphore.await_, lock.token, None if timeout is None else float(timeout)
    )
    if waited == "run":
        return True
    yield from lock.dequeue_steps()
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


def _take_delivered(
    cls: type[UniqueJob], semaphore: Semaphore, lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]
) -> Steps[bool]:
    """Start a delivered job's slot (taking one again if it lapsed); False: skip this delivery."""
    token = lock.token
    outcome = yield twin_of(semaphore.start, semaphore.astart, token)
    if outcome.status in ("busy", "done", "parked"):
        state = {"busy": "running", "done": "done", "parked": "parked"}[outcome.status]
        log.info("%s skipped: a copy of job %s on %s is %s", cls.job_name(), token, semaphore.key, state)
        _detach(lock)
        return False
    if outcome.status == "missing":
        where = (cls.job_name(), token, semaphore.key)
        log.info("%s: slot of job %s on %s lapsed before it started; taking one again", *where)
        park = _queue_park(cls, lock, args, kwargs)
        outcome = yield twin_of(
            semaphore.acquire, semaphore.aacquire, token, running=True, park=park, args=lock.meta.args
        )
        if outcome.status == "parked":
            _detach(lock)  # pushed again when its turn comes
            return False
        if outcome.status == "full":
            yield from _refuse(cls, semaphore, lock)
            return False
    return True


def undo_inline(semaphore: Semaphore | None, lock: JobLock) -> None:
    """An inline call's slot step failed: drop its queued uniqueness lock, then what the step took.

    The uniqueness lock goes first, as after a perform. An inline call has no
    queue that could ever prove it gone, and no expiry unless autoexpire is
    set: left behind, it would refuse the key for good.
    """
    drive(lock.backend, undo_inline_steps(semaphore, lock))


def undo_inline_steps(semaphore: Semaphore | None, lock: JobLock) -> Steps[None]:
    """The steps of :func:`undo_inline`."""
    try:
        yield from lock.dequeue_steps()  # token-checked: only this call's lock, and only while it is queued
    except Exception as exc:
        log.warning("could not drop the lock of %s yet (%s); retrying until the store answers", lock.key, exc)
        undos.add(lock.dequeue, f"queue lock of {lock.key}", (lock.token,))
    if semaphore is not None:
        yield twin_of(semaphore.abandon, semaphore.aabandon, lock.token)


def _undo_delivery(
    semaphore: Semaphore | None, lock: JobLock, settle: Settle | None, exc: BaseException
) -> Steps[None]:
    """A delivery's slot step failed: settle it as a failed delivery, the slot following the lock.

    With ``settle`` the queue decides, as for a failed perform: released for
    good, or kept for its retry (the slot too, if it ran here). Without it the
    lock is released, as a worker's ``execute`` does after any failed perform.
    """
    if settle is None:
        yield from lock.release_steps()
        if semaphore is not None:
            yield twin_of(semaphore.release, semaphore.arelease, lock.token)
        return
    hold = Hold(semaphore, lock.token, None) if semaphore is not None else None
    entered = _holding.set({**_holding.get(), id(lock): hold}) if hold is not None else None
    try:
        yield (settle, (exc, None), _NONE)
    except Exception:
        log.error("could not settle the failed delivery of %s", lock.key, exc_info=True)
    finally:
        if entered is not None:
            _holding.reset(entered)
    if semaphore is not None and hold is not None and not hold.kept:
        yield twin_of(semaphore.release, semaphore.arelease, lock.token)


def _promoted(
    store: SemaphoreStore | AsyncSemaphores, promotion: Promotion
) -> tuple[JobLock, Callable[[], Any]]:
    """The lock of a parked call whose turn came, and its push (in a context of its own) to its queue."""
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


def push_promoted(store: SemaphoreStore, key: str, promotion: Promotion) -> Callable[[], None]:
    """Push a parked call whose turn came to its class's queue; return what to do after the handoff.

    On the sync path an async queue's push runs on this process's background
    event loop. What follows the handoff records the queue's job id in the
    call's uniqueness lock: from then on the queue may prove the job gone. Its
    failure is logged: the job is pushed and handed, only the id is missing from its lock.
    """
    lock, push = _promoted(store, promotion)
    _push_now(push)

    def attach() -> None:
        try:
            drive(lock.backend, lock.attach_steps())
        except Exception:
            _unattached(lock)

    return attach


async def apush_promoted(
    astore: AsyncSemaphores, key: str, promotion: Promotion
) -> Callable[[], Awaitable[None]]:
    """:func:`push_promoted` on the asyncio path: an async queue's push (arq's) awaited here."""
    lock, push = _promoted(astore, promotion)
    await _apush(push)

    async def aattach() -> None:
        try:
            await adrive(lock.backend, lock.attach_steps())
        except Exception:
            _unattached(lock)

    return aattach


def _unattached(lock: JobLock) -> None:
    log.warning("could not record job id %s in the lock of %s", lock.meta.job_id, lock.key, exc_info=True)


def _push_now(push: Callable[[], Any]) -> Any:
    """Call ``push``; an async queue's push (arq's) awaited on the background loop."""
    handle = push()
    if inspect.isawaitable(handle):
        return background.run(handle)
    return handle


async def _apush(push: Callable[[], Any]) -> Any:
    """:func:`_push_now` on the asyncio path: an async queue's push awaited here."""
    handle = push()
    if inspect.isawaitable(handle):
        return await handle
    return handle


on_promotion(push_promoted, apush_promoted)
