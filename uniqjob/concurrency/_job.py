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

Each hook is written once, for asyncio, in ``_job_async.py``; its sync twin
``_job_sync.py`` (the functions imported here) is generated from it by
``scripts/unasync.py``. What needs no I/O is in ``_job_base.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from .._steps import Steps, adrive, drive, twin_of
from . import _job_async, _job_sync
from ._job_base import Parked, Settle, holding, is_inline, job_id, mark_inline
from ._job_sync import execute, push, push_promoted, settle_slot, undo_inline
from ._settings import check, semaphore_of
from .semaphore import Semaphore, on_promotion

if TYPE_CHECKING:
    from ..job import Queue, UniqueJob
    from ..joblock import JobLock

__all__ = [
    "Parked",
    "apush_promoted",
    "check",
    "execute",
    "execute_steps",
    "free",
    "holding",
    "is_inline",
    "job_id",
    "mark_inline",
    "push",
    "push_promoted",
    "push_steps",
    "semaphore_of",
    "settle_slot",
    "settle_slot_steps",
    "undo_inline",
    "undo_inline_steps",
]

#: The asyncio twin of :func:`push_promoted`.
apush_promoted = _job_async.push_promoted


def free(cls: type[UniqueJob], token: str, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Release the slot of job ``token`` (a call of ``cls`` with these arguments) that will never run.

    For a queue that learns a job is gone for good (revoked, expired): its
    slot is freed at once, and the oldest parked call promoted into it,
    instead of lapsing with its lease. False if it held none.
    """
    if cls.concurrency_limit is None:
        return False
    return semaphore_of(cls, args, kwargs).release(token)


# -- TEMPORARY (issue 21): the job layer's steps reach the twins through these --------------------
# until it calls them itself (``_job_sync.push(...)`` / ``await _job_async.push(...)``); then
# these go, and with them this package's last import of uniqjob._steps.


def push_steps(
    cls: type[UniqueJob], queue: Queue, lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]
) -> Steps[Any]:
    """The step of :func:`push`: called on the sync path, awaited on the asyncio one."""
    return (yield twin_of(_job_sync.push, _job_async.push, cls, queue, lock, args, kwargs))


def execute_steps(
    cls: type[UniqueJob],
    lock: JobLock,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    body: Steps[Any],
    *,
    settle: Settle | None = None,
) -> Steps[Any]:
    """The step of :func:`execute`, with ``body``'s steps driven as its body (awaited on the asyncio path)."""
    sync = partial(_job_sync.execute, body=partial(drive, lock.backend, body), settle=settle)
    asynchronous = partial(_job_async.execute, body=partial(adrive, lock.backend, body), settle=settle)
    return (yield twin_of(sync, asynchronous, cls, lock, args, kwargs))


def settle_slot_steps(lock: JobLock, retry_in: float | None) -> Steps[None]:
    """The step of :func:`settle_slot`."""
    yield twin_of(_job_sync.settle_slot, _job_async.settle_slot, lock, retry_in)


def undo_inline_steps(semaphore: Semaphore | None, lock: JobLock) -> Steps[None]:
    """The step of :func:`undo_inline`."""
    yield twin_of(_job_sync.undo_inline, _job_async.undo_inline, semaphore, lock)


on_promotion(push_promoted, apush_promoted)
