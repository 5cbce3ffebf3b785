"""What the concurrency hooks' sync and asyncio code share that does no I/O.

:class:`Parked`, which calls this process performs itself (inline), the slots
this context holds, a call's park, and the promoted call's lock and push.
``_job_async.py`` (the source) and ``_job_sync.py`` (made from it by
``scripts/unasync.py``) build the hooks on these.
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

from ..errors import BackendError
from ..locks import new_token
from ..stores.semaphores import Park, Promotion, SemaphoreStore
from ..stores.semaphores_aio import AsyncSemaphores
from ._background import background
from ._semaphore_base import Hold
from .codec import decode_call, encode_call

if TYPE_CHECKING:
    from ..job import Queue, UniqueJob
    from ..joblock import JobLock

__all__ = [
    "AAfter",
    "ABody",
    "After",
    "Body",
    "Parked",
    "Settle",
    "apush_call",
    "detach",
    "held_by",
    "holding",
    "is_inline",
    "job_id",
    "log",
    "mark_inline",
    "promoted",
    "push_call",
    "queue_park",
    "unattached",
    "with_hold",
    "without_hold",
]

#: The hooks' log, whichever twin writes to it.
log = logging.getLogger("uniqjob.concurrency._job")

#: A queue's settling of a delivery (see ``UniqueJob.execute``): given how it ended, release or keep.
#: An async queue's (arq's) returns an awaitable, awaited on the asyncio path.
Settle = Callable[[BaseException | None, Any], Any]
#: What runs in the slot (the uniqueness locks and perform): called, or awaited on the asyncio path.
Body = Callable[[], Any]
ABody = Callable[[], Awaitable[Any]]
#: What a promotion's push leaves to do once the store knows it was handed.
After = Callable[[], None]
AAfter = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Parked:
    """What ``enqueue`` returns for a job parked behind a concurrency limit.

    It is pushed to its queue when a slot frees up (oldest first); ``position``
    was its place in line when it parked.
    """

    key: str
    token: str
    position: int


def job_id(cls: type[UniqueJob], queue: Queue) -> str:
    """The job id recorded in the uniqueness lock at enqueue.

    A call that may park has none: until promoted it is in no queue, and a
    queue asked about it would rightly say it is gone, freeing its lock.
    """
    if cls.concurrency_limit is not None and cls.concurrency_on_conflict == "block":
        return ""
    return queue.new_job_id()


def queue_park(
    cls: type[UniqueJob], lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]
) -> Park | None:
    """How a call parks for its queue under "block" (its arguments stored); None: it does not park."""
    if cls.concurrency_on_conflict != "block":
        return None
    return Park("queue", encode_call(cls, tuple(args), dict(kwargs), lock.key))


# Calls performed by this process in place of a queue: their "block" waits here.
_inline: weakref.WeakSet[JobLock] = weakref.WeakSet()
# The slots this context holds, by id of their lock: execute() re-entered from inside the slot
# passes straight through, and settle_slot() finds the slot of the delivery it settles.
_NONE_HELD: Mapping[int, Hold] = MappingProxyType({})
_holding: ContextVar[Mapping[int, Hold]] = ContextVar("uniqjob_concurrency_holding", default=_NONE_HELD)


def mark_inline(lock: JobLock) -> None:
    """Say that ``lock``'s call is performed by this process (``run()``, or enqueue without a queue)."""
    _inline.add(lock)


def is_inline(lock: JobLock) -> bool:
    """True if ``lock``'s call is performed by this process (see :func:`mark_inline`)."""
    return lock in _inline


def holding(lock: JobLock) -> bool:
    """True while this context holds ``lock``'s slot (so the hook has already run)."""
    return id(lock) in _holding.get()


def held_by(lock: JobLock) -> Hold | None:
    """The slot this context holds for ``lock``'s delivery; None if it holds none."""
    return _holding.get().get(id(lock))


def with_hold(lock: JobLock, hold: Hold) -> contextvars.Token[Mapping[int, Hold]]:
    """Record that this context holds ``hold`` for ``lock``; reset with the token returned."""
    return _holding.set({**_holding.get(), id(lock): hold})


def without_hold(entered: contextvars.Token[Mapping[int, Hold]]) -> None:
    """Undo :func:`with_hold`."""
    _holding.reset(entered)


def detach(lock: JobLock) -> None:
    """Make a skipped delivery's lock hold nothing, so that settling it frees nothing.

    Its token is the job's, shared with the copy that runs (or with the parked
    call): a queue integration that releases or requeues this delivery's lock
    afterwards must not touch theirs.
    """
    lock.token = new_token()


def promoted(store: SemaphoreStore | AsyncSemaphores, promotion: Promotion) -> tuple[JobLock, Body]:
    """The lock of a parked call whose turn came, and its push to its class's queue."""
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


def unattached(lock: JobLock) -> None:
    log.warning("could not record job id %s in the lock of %s", lock.meta.job_id, lock.key, exc_info=True)


def push_call(push: Body) -> Any:
    """Call ``push``; an async queue's push (arq's) awaited on the background loop."""
    handle = push()
    if inspect.isawaitable(handle):
        return background.run(handle)
    return handle


async def apush_call(push: Body) -> Any:
    """:func:`push_call` on the asyncio path: an async queue's push awaited here."""
    handle = push()
    if inspect.isawaitable(handle):
        return await handle
    return handle
