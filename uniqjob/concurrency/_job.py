"""Concurrency limits on job classes: what the hooks ``UniqueJob`` calls share that does no I/O.

``job.py`` checks a class's settings when it is defined (:func:`check`); its
twins ``uniqjob/_job_async.py`` and ``_job_sync.py`` call the hooks of
``_job_async.py`` / ``_job_sync.py`` here: ``push`` where ``enqueue`` hands a
job to its queue, :func:`mark_inline` and ``execute`` where a job is performed,
and queue integrations call ``settle_slot`` with their verdict on a delivery
(a job the queue retries keeps its slot) or :func:`free` for a job gone for good.

Uniqueness comes first (a duplicate is refused at once, it never waits in
line), then the slot; the slot is released after the uniqueness locks, so a
promoted job never meets its predecessor's run lock. A step that fails undoes,
token-checked, what the call took before it (see ``execute``).
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..locks import new_token
from ..stores._log import get_logger
from ..stores.semaphores import Park
from ._semaphore_base import Hold
from ._settings import check, semaphore_of
from .codec import encode_call

if TYPE_CHECKING:
    from ..job import Queue, UniqueJob
    from ..joblock import JobLock

__all__ = [
    "ABody",
    "Body",
    "Parked",
    "Settle",
    "check",
    "detach",
    "free",
    "held",
    "held_by",
    "holding",
    "is_inline",
    "job_id",
    "log",
    "mark_inline",
    "queue_park",
    "semaphore_of",
]

#: The hooks' log, whichever twin writes to it.
log = get_logger("uniqjob.concurrency._job")

#: A queue's settling of a delivery (see ``UniqueJob.execute``): given how it ended, release or keep.
#: An async queue's (arq's) returns an awaitable, awaited on the asyncio path.
Settle = Callable[[BaseException | None, Any], Any]
#: What runs in the slot (the uniqueness locks and perform): called, or awaited on the asyncio path.
Body = Callable[[], Any]
ABody = Callable[[], Awaitable[Any]]


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


def free(cls: type[UniqueJob], token: str, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Release the slot of job ``token`` (a call of ``cls`` with these arguments) that will never run.

    For a queue that learns a job is gone for good (revoked, expired): its
    slot is freed at once, and the oldest parked call promoted into it,
    instead of lapsing with its lease. False if it held none.
    """
    if cls.concurrency_limit is None:
        return False
    return semaphore_of(cls, args, kwargs).release(token)


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


@contextmanager
def held(lock: JobLock, hold: Hold | None) -> Iterator[None]:
    """Record, for the block, that this context holds ``hold`` for ``lock`` (None: records nothing)."""
    if hold is None:
        yield
        return
    entered = _holding.set({**_holding.get(), id(lock): hold})
    try:
        yield
    finally:
        _holding.reset(entered)


def detach(lock: JobLock) -> None:
    """Make a skipped delivery's lock hold nothing, so that settling it frees nothing.

    Its token is the job's, shared with the copy that runs (or with the parked
    call): a queue integration that releases or requeues this delivery's lock
    afterwards must not touch theirs.
    """
    lock.token = new_token()
