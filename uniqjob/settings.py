"""Validation of a job class's ``unique_*`` settings, run when the class is defined.

A bad value fails at import, not at 3 a.m.: unknown policies and strategies,
durations that are not positive. (Misspelt setting names, and names that clash
with the mixin's own, are :mod:`uniqjob._names`'s.)
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, get_args

from . import config
from ._ticks import parse_period
from .errors import ConfigurationError
from .joblock import STRATEGIES
from .stores._log import get_logger
from .stores.base import Backend

if TYPE_CHECKING:
    from datetime import timedelta

    from .job import Queue, UniqueJob

__all__ = [
    "MAX_RUN_LEASE",
    "MIN_RUN_LEASE",
    "POLICIES",
    "SETTINGS",
    "ConflictPolicy",
    "check",
    "check_store",
    "once_per",
    "one_of",
    "run_lease",
    "seconds",
]

log = get_logger(__name__)

ConflictPolicy = Literal["log", "discard", "raise", "reschedule", "use_existing", "keep_last", "replace"]
POLICIES: tuple[ConflictPolicy, ...] = get_args(ConflictPolicy)

#: Every setting a job class may define; any other ``unique_*`` or ``concurrency_*`` attribute is a typo.
SETTINGS = frozenset(
    {
        "unique_lock_autoexpire",
        "unique_on_conflict",
        "unique_run_lease",
        "unique_args",
        "unique_key",
        "unique_backend",
        "unique_queue",
        "unique_strategy",
        "unique_lock_limit",
        "unique_reschedule_delay",
        "unique_on_lost",
        "unique_once_per",
        "unique_debounce",
        "unique_debounce_max_wait",
        "concurrency_limit",
        "concurrency_duration",
        "concurrency_on_conflict",
        "concurrency_key",
        "concurrency_wait_timeout",
    }
)


#: The shortest run lease (seconds): a holder renews it every third, and a renewal slower than
#: a third of it presumes the lock lost; below a second, one slow reply would stop a job.
MIN_RUN_LEASE = 1.0
#: The longest run lease (seconds): a holder that dies keeps its key this long.
MAX_RUN_LEASE = 86400.0


def run_lease(value: object, what: str) -> float:
    """Validate a run lease: seconds (or a timedelta) from :data:`MIN_RUN_LEASE` to :data:`MAX_RUN_LEASE`."""
    lease = seconds(value, what)
    if lease is None:
        raise ConfigurationError(f"{what} must be set")
    if not MIN_RUN_LEASE <= lease <= MAX_RUN_LEASE:
        raise ConfigurationError(
            f"{what} must be {MIN_RUN_LEASE:g} to {MAX_RUN_LEASE:g} seconds (a day), got {value!r}: a holder"
            " renews it every third, so a shorter one is lost to one slow reply, and a longer one keeps a"
            " dead holder's key that long"
        )
    return lease


def _is_timedelta(value: object) -> TypeGuard[timedelta]:
    """``isinstance(value, timedelta)``, without importing datetime: a timedelta exists only once it is."""
    datetime = sys.modules.get("datetime")
    return datetime is not None and isinstance(value, datetime.timedelta)


def seconds(value: object, what: str) -> float | None:
    """Validate a duration setting: None, or a positive, finite number of seconds or timedelta."""
    if value is None:
        return None
    if _is_timedelta(value):
        result = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        result = float(value)
    else:
        raise ConfigurationError(f"{what} must be a number of seconds or a timedelta, got {value!r}")
    if not result > 0 or result == float("inf"):
        raise ConfigurationError(f"{what} must be positive and finite, got {value!r}")
    return result


def check(cls: type[UniqueJob], queue_base: type[Queue]) -> None:
    """Raise :class:`ConfigurationError` naming the first bad setting of job class ``cls``."""
    import inspect  # here: the command, which never checks a job class, need not load it

    name = cls.__qualname__
    one_of(name, "unique_on_conflict", cls.unique_on_conflict, POLICIES)
    one_of(name, "unique_strategy", cls.unique_strategy, STRATEGIES)
    autoexpire: Any = cls.unique_lock_autoexpire
    if not isinstance(inspect.getattr_static(cls, "unique_lock_autoexpire"), classmethod):
        autoexpire = seconds(autoexpire, f"{name}.unique_lock_autoexpire")
    if cls.unique_strategy == "until_expired" and autoexpire is None and cls.unique_once_per is None:
        raise ConfigurationError(
            f"{name}.unique_strategy 'until_expired' needs unique_lock_autoexpire: nothing else frees it"
        )
    run_lease(cls.unique_run_lease, f"{name}.unique_run_lease")
    limit = cls.unique_lock_limit
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ConfigurationError(f"{name}.unique_lock_limit must be a whole number >= 1, got {limit!r}")
    delay = cls.unique_reschedule_delay
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay < float("inf"):
        raise ConfigurationError(f"{name}.unique_reschedule_delay must be seconds >= 0, got {delay!r}")
    backend = cls.unique_backend
    if backend is not None and not isinstance(backend, (str, Backend)):
        raise ConfigurationError(
            f"{name}.unique_backend must be a Backend or a URL, got {type(backend).__name__}"
        )
    queue = cls.unique_queue
    if queue is not None and not isinstance(queue, queue_base):
        raise ConfigurationError(f"{name}.unique_queue must be a uniqjob.Queue, got {type(queue).__name__}")
    rescheduled = cls.unique_on_conflict == "reschedule"
    if rescheduled and queue is not None and type(queue).push_later is queue_base.push_later:
        raise ConfigurationError(
            f"{name}.unique_on_conflict is 'reschedule', but {type(queue).__name__} cannot delay jobs"
        )
    _check_use_existing(cls, name, queue_base)
    _check_coalescing(cls, name, queue, queue_base)
    on_lost = cls.unique_on_lost
    if on_lost is not None and not callable(on_lost):
        raise ConfigurationError(
            f"{name}.unique_on_lost must be a callable taking the JobLock, got {type(on_lost).__name__}"
        )
    _check_once_per(cls, name, autoexpire)
    if (
        queue is not None
        and not queue.proves_jobs_gone
        and cls.unique_strategy != "while_executing"
        and autoexpire is None
        and cls.unique_once_per is None
    ):
        log.warning(
            "%s: its queue (%s) cannot prove a job gone, so the queue lock of a job lost from it (a purged"
            " task) never clears and refuses that call for good; set unique_lock_autoexpire to seconds"
            " longer than a job may wait and run (e.g. unique_lock_autoexpire = 3600)",
            name,
            type(queue).__name__,
        )
    _check_unique_args(cls)
    perform = inspect.getattr_static(cls, "perform")
    perform = getattr(perform, "__func__", perform)  # a classmethod's or staticmethod's function
    if inspect.isasyncgenfunction(perform):
        raise ConfigurationError(
            f"{name}.perform is an async generator: a job's perform returns (or, async, is awaited); "
            "it cannot be iterated under a lock"
        )


_store_checked: set[type] = set()  # classes whose store check_store() has looked at


def check_store(cls: type[UniqueJob]) -> None:
    """At a class's first enqueue onto a queue: warn if its locks are in the per-host store nobody chose."""
    # a class with settings for one call (Job.using()) is its class here: warned about once
    cls = vars(cls).get("_percall_origin", cls)
    if cls in _store_checked:
        return
    _store_checked.add(cls)
    if cls.unique_backend is None and config.default_is_implicit():
        log.warning(
            "%s: its locks are in the default file store (%s), which only this host sees: producers and"
            " workers on other hosts do not see them; give every process one shared store:"
            " uniqjob.configure('redis://HOST:6379/0') at start-up, or UNIQJOB_URL=redis://HOST:6379/0"
            " in the environment, or unique_backend on the class",
            cls.job_name(),
            config.default_directory(),
        )


def once_per(value: object, what: str) -> float | None:
    """Validate a ``once_per`` period: None, seconds or a timedelta, or text such as ``5m``; in seconds."""
    if isinstance(value, str):
        try:
            return parse_period(value)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{what}: {exc}") from None
    return seconds(value, what)


def _check_once_per(cls: type[UniqueJob], name: str, autoexpire: object) -> None:
    if once_per(cls.unique_once_per, f"{name}.unique_once_per") is None:
        return
    if cls.unique_strategy not in ("until_executed", "until_expired"):
        raise ConfigurationError(
            f"{name}.unique_once_per keeps each tick's lock until the tick ends: it takes no"
            f" unique_strategy {cls.unique_strategy!r}"
        )
    if cls.unique_on_conflict == "reschedule":
        raise ConfigurationError(
            f"{name}.unique_once_per drops a tick's duplicates: unique_on_conflict 'reschedule' would"
            " run them in a later tick"
        )
    if autoexpire is not None:
        raise ConfigurationError(
            f"{name}.unique_once_per sets the lock's expiry (its tick's end): drop unique_lock_autoexpire"
        )


def _check_use_existing(cls: type[UniqueJob], name: str, queue_base: type[Queue]) -> None:
    """'use_existing' returns the holder's queue handle: the class's queue must be able to make one."""
    queue = cls.unique_queue
    if cls.unique_on_conflict != "use_existing" or (queue is None and cls._plan.signature is None):
        return  # (a base class of jobs with no perform and no queue: its subclasses give the queue)
    if queue is None:
        raise ConfigurationError(
            f"{name}.unique_on_conflict is 'use_existing', but the class has no unique_queue: a duplicate"
            " gets the queue's handle of the job already on its way, and a call run inline has none"
        )
    if type(queue).handle is queue_base.handle:
        raise ConfigurationError(
            f"{name}.unique_on_conflict is 'use_existing', but its queue {queue!r} cannot give a job's"
            " handle (it has no handle(job_id) method)"
        )


def debounce(cls: type[UniqueJob]) -> tuple[float, float | None] | None:
    """``cls``'s debounce, in seconds: its delay and longest wait; None without one."""
    wait = seconds(cls.unique_debounce, f"{cls.__qualname__}.unique_debounce")
    longest = seconds(cls.unique_debounce_max_wait, f"{cls.__qualname__}.unique_debounce_max_wait")
    return None if wait is None else (wait, longest)


def _check_debounce(cls: type[UniqueJob], name: str, queue: Queue | None, queue_base: type[Queue]) -> None:
    """Debounce delays a call in its queue and coalesces the calls of a burst into it."""
    wait = debounce(cls)
    if wait is None:
        if cls.unique_debounce_max_wait is not None:
            raise ConfigurationError(f"{name}.unique_debounce_max_wait needs unique_debounce")
        return
    if wait[1] is not None and wait[1] < wait[0]:
        raise ConfigurationError(
            f"{name}.unique_debounce_max_wait ({wait[1]:g} s) is shorter than unique_debounce ({wait[0]:g} s)"
        )
    if cls.unique_on_conflict not in ("log", "keep_last"):
        raise ConfigurationError(
            f"{name}.unique_debounce coalesces the calls of a burst into the latest: it takes"
            f" unique_on_conflict 'keep_last' (or none), not {cls.unique_on_conflict!r}"
        )
    if queue is None or type(queue).push_in is queue_base.push_in:
        where = f"{type(queue).__name__}, which cannot" if queue else "no queue (run() performs at once)"
        raise ConfigurationError(f"{name}.unique_debounce delays its job in its queue: it has {where}")


def _check_coalescing(cls: type[UniqueJob], name: str, queue: Queue | None, queue_base: type[Queue]) -> None:
    """A coalescing policy (keep_last, replace, debounce) needs what it stands on; see uniqjob._coalesce."""
    _check_debounce(cls, name, queue, queue_base)
    policy = cls.unique_on_conflict
    if policy not in ("keep_last", "replace") and cls.unique_debounce is None:
        return
    what = f"{name}.unique_on_conflict {policy!r}"
    if cls.unique_debounce is not None:
        what = f"{name}.unique_debounce"
    if cls.unique_strategy != "until_executed":
        raise ConfigurationError(f"{what} coalesces queued and running calls: it needs unique_strategy"
                                 f" 'until_executed', not {cls.unique_strategy!r}")  # fmt: skip
    if getattr(cls, "concurrency_limit", None) is not None or cls.unique_once_per is not None:
        raise ConfigurationError(f"{what} takes no concurrency_limit and no unique_once_per")
    if queue is None:
        return
    if queue.suspect_after is None:
        raise ConfigurationError(
            f"{what} needs a queue that names a job before it is pushed; {type(queue).__name__} does not"
        )
    if policy == "replace" and type(queue).remove is queue_base.remove:
        raise ConfigurationError(f"{what} needs a queue that can remove a job; {type(queue).__name__} cannot")


def one_of(name: str, attr: str, value: object, allowed: tuple[str, ...]) -> None:
    """Refuse setting ``attr`` of class ``name`` unless its ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ConfigurationError(f"{name}.{attr} must be one of {', '.join(allowed)}; got {value!r}")


def _check_unique_args(cls: type[UniqueJob]) -> None:
    names = cls.unique_args
    if names is None:
        return
    where = f"{cls.__qualname__}.unique_args"
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ConfigurationError(f"{where} must be a tuple of parameter names, e.g. ('account_id',)")
    signature = cls._plan.signature
    if signature is not None:
        unknown = [n for n in names if n not in signature.parameters]
        if unknown:
            raise ConfigurationError(
                f"{where} names {', '.join(unknown)}, not parameters of perform{signature}"
            )
