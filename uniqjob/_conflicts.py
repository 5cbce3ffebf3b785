"""What a duplicate call becomes: the job class's ``unique_on_conflict`` policy."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from . import _coalesce
from ._job_base import log  # the job layer's logger: a dropped duplicate is logged as the job's
from .errors import JobNotUnique, holder_text
from .joblock import JobLock

if TYPE_CHECKING:
    from .job import UniqueJob

__all__ = ["RESCHEDULED", "apply"]

#: An inline call to try again after ``unique_reschedule_delay``.
RESCHEDULED: Any = object()


def apply(cls: type[UniqueJob], lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Apply ``cls``'s policy to a call whose ``lock`` conflicted; return the call's result (None).

    "raise" raises :class:`JobNotUnique`; "reschedule" hands the call to the
    queue to enqueue again later, or, with no queue, returns
    :data:`RESCHEDULED` for the caller to wait and try again; "use_existing"
    returns the queue's handle of the holder's job (see :func:`_existing`).
    """
    policy = cls.unique_on_conflict
    if _coalesce.mode(cls):
        return _coalesce.conflict(cls, lock)
    if policy == "raise":
        raise JobNotUnique(lock.key, _holder(lock))
    if policy == "use_existing":
        handle = _existing(cls, lock)
        if handle is not None:
            return handle
        policy = "log"
    # A duplicate is the common case of a busy queue: the holder's facts are
    # gathered only for a log line that is written.
    if policy in ("log", "reschedule") and log.isEnabledFor(logging.INFO):
        what, facts = "dropped" if policy == "log" else "rescheduled", holder_text(_holder(lock))
        log.info("%s %s: %s is already locked (%s)", cls.job_name(), what, lock.key, facts)
    if policy == "reschedule":
        queue = cls.unique_queue
        if queue is None:
            return RESCHEDULED
        later = queue.push_later(cls, tuple(args), dict(kwargs), float(cls.unique_reschedule_delay))
        if inspect.isawaitable(later):  # an async queue's (arq): the asyncio API awaits it
            return _dropped(later)
    return None


def _existing(cls: type[UniqueJob], lock: JobLock) -> Any:
    """The queue's handle of the job holding ``lock``'s key (maybe awaitable); None if there is none.

    None for an inline call (``run()``: it wants a result now, not a handle), a refusal by a
    run lock alone (a worker's start, or an inline run's), and a queue lock that names no job.
    """
    from .concurrency import _job as _concurrency  # loaded by the job layer already

    queue, state = cls.unique_queue, lock.conflict
    if queue is None or state is None or state.refused == "run" or _concurrency.is_inline(lock):
        return None
    held = state.queue
    if held is None or not held.meta.job_id:
        return None
    return queue.handle(held.meta.job_id)


async def _dropped(later: Awaitable[Any]) -> None:
    await later


def _holder(lock: JobLock) -> dict[str, object]:
    """The facts of what blocked ``lock``'s last acquire or start, for a log line or an error."""
    return lock.conflict.describe() if lock.conflict is not None else {}
