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
from typing import TYPE_CHECKING, Any

from . import _job_async
from ._job_base import Parked, holding, is_inline, job_id, mark_inline
from ._job_sync import execute, push, push_promoted, settle_slot, undo_inline
from ._settings import check, semaphore_of
from .semaphore import on_promotion

if TYPE_CHECKING:
    from ..job import UniqueJob

__all__ = [
    "Parked",
    "apush_promoted",
    "check",
    "execute",
    "free",
    "holding",
    "is_inline",
    "job_id",
    "mark_inline",
    "push",
    "push_promoted",
    "semaphore_of",
    "settle_slot",
    "undo_inline",
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


on_promotion(push_promoted, apush_promoted)
