"""The UniqueJob mixin: class settings, keys, enqueue and run, and the queue hooks.

What a class's definition decides about keys and locks, and the one lock
builder, are in :mod:`uniqjob._plan`; what a duplicate becomes, in
:mod:`uniqjob._conflicts`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, ClassVar, Self

from . import _conflicts, _job_async, _job_sync, _names, _percall, config, settings
from ._job_base import refuse_sync
from ._plan import JobPlan, build_lock, plan_of, planned_key
from .concurrency import _job as _concurrency
from .concurrency._settings import ConcurrencyPolicy
from .concurrency.semaphore import Semaphore
from .errors import ConfigurationError
from .joblock import JobLock, Strategy
from .keys import KEY_VERSION, digest, make_key
from .queues import Queue
from .settings import ConflictPolicy
from .stores.aio import async_backend
from .stores.base import Backend

__all__ = ["ConflictPolicy", "Queue", "UniqueJob"]


class UniqueJob:
    """Mix into a job class to stop duplicate calls of it.

    Each call's lock key comes from the class and ``perform``'s arguments.
    ``enqueue`` takes a queue lock; ``perform`` runs under a run lock kept alive
    by a heartbeat; both are released when ``perform`` ends, however it ends.
    """

    #: Seconds (or a timedelta, or a classmethod returning either) after which a
    #: queue lock expires even if its job never ran; None: never.
    unique_lock_autoexpire: ClassVar[float | timedelta | None] = None
    #: What a duplicate does: "log" (drop, log at INFO), "discard", "raise", "reschedule",
    #: "keep_last" (the latest call runs) or "replace" (it takes a queued call's place).
    unique_on_conflict: ClassVar[ConflictPolicy] = "log"
    #: What is locked when: see the README's "Choosing a strategy".
    unique_strategy: ClassVar[Strategy] = "until_executed"
    #: How many calls may hold one key at once; the next one is the conflict.
    unique_lock_limit: ClassVar[int] = 1
    #: Seconds after which a "reschedule"d duplicate tries again.
    unique_reschedule_delay: ClassVar[float] = 5.0
    #: Seconds a run lock outlives its holder's last heartbeat (beats every third of it).
    unique_run_lease: ClassVar[float] = 30.0
    #: Names of the ``perform`` parameters that make the key; None: all of them.
    unique_args: ClassVar[Sequence[str] | None] = None
    #: This class's backend (a Backend or a URL); None: the process-wide default.
    unique_backend: ClassVar[Backend | str | None] = None
    #: The queue ``enqueue`` hands jobs to; None: run inline, like a queue in eager mode.
    unique_queue: ClassVar[Queue | None] = None
    #: Called with the JobLock, once, from the heartbeat thread, when a running job's lock is
    #: lost or presumed lost (``lock.lost``); None: the loss is only logged.
    unique_on_lost: ClassVar[Callable[[JobLock], None] | None] = None
    #: One run per tick of this period (seconds, a timedelta or "5m") of the store's clock, each
    #: tick's lock kept until the tick ends; None: no ticks. README "Cron on every host".
    unique_once_per: ClassVar[float | timedelta | str | None] = None
    #: Seconds (or a timedelta): a call runs this long after the last call of its key in a burst,
    #: with that call's arguments (through the queue's delayed push); None: at once.
    unique_debounce: ClassVar[float | timedelta | None] = None
    #: With unique_debounce: a burst's job runs at the latest this long after its first call.
    unique_debounce_max_wait: ClassVar[float | timedelta | None] = None

    #: What the class's definition decides about its keys and locks (set on every class).
    _plan: ClassVar[JobPlan] = JobPlan()

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        """Check the class's settings; ``abstract=True``: a base class of jobs, which needs no ``perform``."""
        super().__init_subclass__(**kwargs)
        _names.check(cls, UniqueJob)  # first: a clash (backend = "s3") would break what follows
        if not abstract:
            _check_perform(cls)
        cls._plan = plan_of(cls, UniqueJob)
        settings.check(cls, Queue)
        _concurrency.check(cls)

    # -- the job ---------------------------------------------------------------------

    def perform(self, *args: Any, **kwargs: Any) -> Any:
        """The job's work. Override it (as a method, classmethod or staticmethod)."""
        raise NotImplementedError(f"{type(self).__qualname__} must define perform()")

    @classmethod
    def invoke(cls, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Call ``perform`` (on a new instance for a plain method) and return its result; no locks."""
        if cls._plan.bound:
            return cls.perform(*args, **kwargs)
        return cls().perform(*args, **kwargs)

    # -- keys ------------------------------------------------------------------------

    @classmethod
    def job_name(cls) -> str:
        """Return the name that starts this class's keys: ``module.QualName``."""
        return f"{cls.__module__}.{cls.__qualname__}"

    @classmethod
    def unique_key(cls, *args: Any, **kwargs: Any) -> Any:
        """Return the value whose digest makes the key; override to choose it.

        By default: ``perform``'s arguments, bound to its signature with defaults
        applied (so ``f(1)`` and ``f(a=1)`` are one key), limited to ``unique_args``.
        """
        arguments = cls._plan.arguments(args, kwargs)
        if arguments is None:
            raise ConfigurationError(f"{cls.__qualname__} must define perform()")
        if cls.unique_args is not None:
            return {name: arguments[name] for name in cls.unique_args}
        return arguments

    @classmethod
    def lock_key(cls, *args: Any, **kwargs: Any) -> str:
        """Return the lock key of a call with these arguments."""
        key = planned_key(cls, cls.job_name(), args, kwargs)
        if key is not None:
            return key
        value = cls.unique_key(*args, **kwargs)
        if cls._plan.custom_key:
            return f"{cls.job_name()}:{KEY_VERSION}:{digest(value, 'unique_key()')}"
        return make_key(cls.job_name(), value)

    # -- settings resolved per call ---------------------------------------------------

    @classmethod
    def backend(cls) -> Backend:
        """Return the backend this class's locks live in."""
        target = cls.unique_backend
        return config.default_backend() if target is None else config.resolve(target)

    @classmethod
    def autoexpire(cls) -> float | None:
        """Return ``unique_lock_autoexpire`` in seconds (calling it if it is a classmethod).

        Plus the queue's :meth:`~uniqjob.queues.Queue.pending_delay`: the lock of a job
        pushed with a countdown (an ETA) never expires before its job is due.
        """
        value: Any = cls.unique_lock_autoexpire
        if value is None:
            return None
        if callable(value):
            value = value()
        seconds = settings.seconds(value, f"{cls.__qualname__}.unique_lock_autoexpire")
        queue = cls.unique_queue
        if seconds is None or queue is None:
            return seconds
        return seconds + queue.pending_delay()

    @classmethod
    def lock(cls, *args: Any, **kwargs: Any) -> JobLock:
        """Return a new :class:`JobLock` for a call with these arguments (nothing is taken yet)."""
        return build_lock(cls, args, kwargs)

    @classmethod
    def lock_from(cls, key: str, token: str | None, *, adopt: bool = False) -> JobLock:
        """Rebuild a job's lock from the key and token that travelled with it (worker side)."""
        return build_lock(cls, (), {}, key=key, token=token, adopt=adopt)

    @classmethod
    def using(cls, **settings: Any) -> type[Self]:
        """This class with other settings for one call: ``Export.using(on_conflict="raise").enqueue(42)``.

        ``settings`` are ``unique_*`` settings without their prefix, those the
        calling side applies (``on_conflict``, ``lock_autoexpire``,
        ``reschedule_delay``; see :mod:`uniqjob._percall`), checked as the
        class's are. The class returned has this class's name, keys and queue.
        """
        return _percall.using(cls, settings)

    # -- the user's entry points -------------------------------------------------------
    # (each is written once, in _job_async.py; the sync ones call its generated twin: docs/internals.md)

    @classmethod
    def enqueue(cls, *args: Any, **kwargs: Any) -> Any:
        """Take the queue lock and hand the job to its queue (inline: run it now).

        Returns the queue's job handle (inline: ``perform``'s result), or None
        when the call is a duplicate and the policy drops or reschedules it.
        """
        if cls._plan.asynchronous and cls.unique_queue is None:
            refuse_sync(cls, "enqueue")
        # (lock() is not overridden when plain: straight to its body, the call not packed again)
        lock = build_lock(cls, args, kwargs) if cls._plan.plain else cls.lock(*args, **kwargs)
        return _job_sync.enqueue(cls, lock, lock.backend, args, kwargs)

    @classmethod
    async def aenqueue(cls, *args: Any, **kwargs: Any) -> Any:
        """:meth:`enqueue`, awaited: inline, ``perform`` (async or not) runs in this event loop."""
        lock = build_lock(cls, args, kwargs) if cls._plan.plain else cls.lock(*args, **kwargs)
        return await _job_async.enqueue(cls, lock, async_backend(lock.backend), args, kwargs)

    @classmethod
    def run(cls, *args: Any, **kwargs: Any) -> Any:
        """Lock, perform in this process, release; for scripts and cron.

        Returns ``perform``'s result, or None when the key is held and the policy drops the call.
        """
        if cls._plan.asynchronous:
            refuse_sync(cls, "run")
        lock = build_lock(cls, args, kwargs) if cls._plan.plain else cls.lock(*args, **kwargs)
        return _job_sync.run(cls, lock, lock.backend, args, kwargs)

    @classmethod
    async def arun(cls, *args: Any, **kwargs: Any) -> Any:
        """:meth:`run`, awaited: ``perform`` (async or not) runs in this event loop, under the locks.

        The store is awaited (Redis through ``redis.asyncio``, files in a thread); the
        run lock's heartbeat renews on its own thread, whatever else the loop is doing.
        """
        lock = build_lock(cls, args, kwargs) if cls._plan.plain else cls.lock(*args, **kwargs)
        return await _job_async.run(cls, lock, async_backend(lock.backend), args, kwargs)

    @classmethod
    def execute(
        cls,
        lock: JobLock,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        *,
        settle: Callable[[BaseException | None, Any], None] | None = None,
    ) -> Any:
        """Worker side: perform under the strategy's locks, releasing them after; returns its result.

        A conflict at execution time (another live job holds the run lock)
        drops this call's own queued lock and applies the conflict policy; a
        second live delivery of this very job (same token) is skipped.
        ``settle``, given by a queue that may run the job again (a retry), is
        called with perform's exception or result instead of releasing the
        locks, and settles them itself (``lock.release()`` or ``lock.requeue()``)
        before any concurrency slot is given up.
        """
        if cls._plan.asynchronous:
            refuse_sync(cls, "execute")
        return _job_sync.execute(cls, lock, lock.backend, args, kwargs, settle=settle)

    @classmethod
    async def aexecute(
        cls,
        lock: JobLock,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        *,
        settle: Callable[[BaseException | None, Any], Any] | None = None,
    ) -> Any:
        """:meth:`execute`, awaited (an async worker's side); ``settle`` may be async."""
        return await _job_async.execute(cls, lock, async_backend(lock.backend), args, kwargs, settle=settle)

    # -- hooks for queues --------------------------------------------------------------

    @classmethod
    def before_enqueue(cls, *args: Any, **kwargs: Any) -> bool:
        """Take the queue lock for these arguments; on conflict apply the policy and return False.

        Under "reschedule" with no queue to delay the call, the conflict is logged and False returned.
        """
        if cls.unique_strategy == "while_executing":
            return True  # nothing is locked at enqueue
        lock = cls.lock(*args, **kwargs)
        queue = cls.unique_queue
        if queue is not None:
            settings.check_store(cls)
        if lock.acquire(
            gone=queue.job_gone if queue is not None and lock.strategy != "until_expired" else None
        ):
            return True
        _conflicts.apply(cls, lock, args, kwargs)
        return False

    @classmethod
    @contextmanager
    def around_perform(cls, *args: Any, **kwargs: Any) -> Iterator[JobLock]:
        """Hold the key's locks while the body runs: the queued lock is taken over, the run lock kept alive.

        Raises :class:`JobNotUnique` if another live job holds the run lock.
        """
        lock = build_lock(cls, args, kwargs, adopt=True)
        with lock.running():
            yield lock

    @classmethod
    def after_dequeue(cls, *args: Any, **kwargs: Any) -> bool:
        """Drop the key's queue lock while it is still queued (its job left the queue); True if dropped."""
        lock = cls.lock(*args, **kwargs)
        return any(lock.backend.dequeue(key) for key in lock.candidate_keys())

    @classmethod
    def is_locked(cls, *args: Any, **kwargs: Any) -> bool:
        """True when an enqueue with these arguments would conflict now; orphans don't count."""
        inline = cls.unique_queue is None or cls.unique_strategy == "while_executing"
        return cls.lock(*args, **kwargs).held(run_conflicts=inline)

    @classmethod
    async def ais_locked(cls, *args: Any, **kwargs: Any) -> bool:
        """:meth:`is_locked`, awaited."""
        inline = cls.unique_queue is None or cls.unique_strategy == "while_executing"
        return await cls.lock(*args, **kwargs).aheld(run_conflicts=inline)

    # -- concurrency limits (uniqjob.concurrency; README "Concurrency limits") --------------

    #: Up to this many calls with one concurrency key hold a slot (queued or running) at once;
    #: None: no limit.
    concurrency_limit: ClassVar[int | None] = None
    #: Seconds (or a timedelta) a slot outlives its holder's silence; renewed while the job runs.
    concurrency_duration: ClassVar[float | timedelta] = 15 * 60
    #: What a call does when its key is at the limit: "block" (park it), "discard" or "raise".
    concurrency_on_conflict: ClassVar[ConcurrencyPolicy] = "block"
    #: Inline "block" only: seconds to wait for a turn before raising; None: as long as it takes.
    concurrency_wait_timeout: ClassVar[float | None] = None

    @classmethod
    def concurrency_key(cls, *args: Any, **kwargs: Any) -> Any:
        """Return the value (text, or anything a lock key can hold) naming this call's semaphore.

        None, the default: one semaphore for the whole class.
        """
        return None

    @classmethod
    def semaphore(cls, *args: Any, **kwargs: Any) -> Semaphore:
        """Return the concurrency semaphore a call with these arguments counts against."""
        return _concurrency.semaphore_of(cls, args, kwargs)


def _check_perform(cls: type[UniqueJob]) -> None:
    """Refuse a job class that inherits ``UniqueJob.perform``: every call of it would fail."""
    if getattr(cls, "perform", None) is not getattr(UniqueJob, "perform", None):
        return
    raise ConfigurationError(
        f"{cls.__module__}.{cls.__qualname__} defines no perform(): define the job's work as"
        f" perform(self, ...), or, for a base class of jobs, declare it abstract:"
        f" class {cls.__name__}(UniqueJob, abstract=True)"
    )
