"""The UniqueJob mixin: class settings, keys, enqueue and run, and the queue hooks.

What a class's definition decides about keys and locks, and the one lock
builder, are in :mod:`uniqjob._plan`; what a duplicate becomes, in
:mod:`uniqjob._conflicts`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, ClassVar

from . import _conflicts, _names, config, settings
from ._plan import JobPlan, build_lock, plan_of, planned_values
from ._steps import Steps, adrive, drive, sleep_of
from .concurrency import _job as _concurrency
from .concurrency._settings import ConcurrencyPolicy
from .concurrency.semaphore import Semaphore
from .errors import ConfigurationError, JobNotUnique
from .joblock import JobLock, Strategy
from .keys import KEY_VERSION, digest, make_key
from .locks import QueueMeta
from .queues import Queue
from .settings import ConflictPolicy
from .stores.base import Backend

__all__ = ["ConflictPolicy", "Queue", "UniqueJob"]

log = logging.getLogger(__name__)

_sleep = time.sleep  # replaced by tests

_NONE: dict[str, Any] = {}  # a step's keyword arguments: none


class UniqueJob:
    """Mix into a job class to stop duplicate calls of it.

    Each call's lock key comes from the class and ``perform``'s arguments.
    ``enqueue`` takes a queue lock; ``perform`` runs under a run lock kept alive
    by a heartbeat; both are released when ``perform`` ends, however it ends.
    """

    #: Seconds (or a timedelta, or a classmethod returning either) after which a
    #: queue lock expires even if its job never ran; None: never.
    unique_lock_autoexpire: ClassVar[float | timedelta | None] = None
    #: What a duplicate does: "log" (drop, log at INFO), "discard", "raise" or "reschedule".
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
        plan = cls._plan.key
        values = None if plan is None else planned_values(cls, plan, args, kwargs)
        if plan is not None and values is not None:
            # The usual call, sooner: the same key as make_key(name, unique_key(...)).
            return plan.key(cls.job_name(), values)
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
        """Return ``unique_lock_autoexpire`` in seconds (calling it if it is a classmethod)."""
        value: Any = cls.unique_lock_autoexpire
        if value is None:
            return None
        if callable(value):
            value = value()
        return settings.seconds(value, f"{cls.__qualname__}.unique_lock_autoexpire")

    @classmethod
    def lock(cls, *args: Any, **kwargs: Any) -> JobLock:
        """Return a new :class:`JobLock` for a call with these arguments (nothing is taken yet)."""
        return build_lock(cls, args, kwargs)

    @classmethod
    def lock_from(cls, key: str, token: str | None, *, adopt: bool = False) -> JobLock:
        """Rebuild a job's lock from the key and token that travelled with it (worker side)."""
        return build_lock(cls, (), {}, key=key, token=token, adopt=adopt)

    # -- the user's entry points -------------------------------------------------------
    #
    # Each is written once, as steps (uniqjob._steps): the sync entry point drives them by
    # calling the store and perform, the asyncio one (arun, aenqueue) by awaiting them.

    @classmethod
    def enqueue(cls, *args: Any, **kwargs: Any) -> Any:
        """Take the queue lock and hand the job to its queue (inline: run it now).

        Returns the queue's job handle (inline: ``perform``'s result), or None
        when the call is a duplicate and the policy drops or reschedules it.
        """
        if cls._plan.asynchronous and cls.unique_queue is None:
            _refuse_sync(cls, "enqueue")
        # (lock() is not overridden when plain: straight to its body, the call not packed again)
        lock = build_lock(cls, args, kwargs) if cls._plan.plain else cls.lock(*args, **kwargs)
        return drive(lock.backend, cls._enqueue_steps(lock, args, kwargs))

    @classmethod
    async def aenqueue(cls, *args: Any, **kwargs: Any) -> Any:
        """:meth:`enqueue`, awaited: inline, ``perform`` (async or not) runs in this event loop."""
        lock = build_lock(cls, args, kwargs) if cls._plan.plain else cls.lock(*args, **kwargs)
        return await adrive(lock.backend, cls._enqueue_steps(lock, args, kwargs))

    @classmethod
    def _enqueue_steps(cls, lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]) -> Steps[Any]:
        queue = cls.unique_queue
        if queue is None:
            return (yield from cls._run_steps(lock, args, kwargs))
        settings.check_store(cls)
        # An until_expired lock outlives its job on purpose: its job being gone proves nothing.
        gone = None if lock.strategy == "until_expired" else queue.job_gone
        if cls.unique_strategy != "while_executing" and not (yield from lock.acquire_steps(gone=gone)):
            return (yield (_conflicts.apply, (cls, lock, args, kwargs), _NONE))
        try:
            # Made once the lock is ours: a duplicate needs no id, and acquire() records none.
            job_id = _concurrency.job_id(cls, queue)
            if job_id:
                meta = lock.meta
                lock.meta = QueueMeta(meta.cls, meta.args, job_id)
            if cls.concurrency_limit is None:  # no slot to take: straight to the queue
                handle = yield (queue.push, (cls, lock, tuple(args), dict(kwargs)), _NONE)
            else:
                handle = yield from _concurrency.push_steps(cls, queue, lock, args, kwargs)
        except BaseException:
            yield from lock.dequeue_steps()
            raise
        if lock.meta.job_id:
            yield from lock.attach_steps()  # the job exists now: its queue may prove it gone from here on
        return handle

    @classmethod
    def run(cls, *args: Any, **kwargs: Any) -> Any:
        """Lock, perform in this process, release; for scripts and cron.

        Returns ``perform``'s result, or None when the key is held and the policy drops the call.
        """
        if cls._plan.asynchronous:
            _refuse_sync(cls, "run")
        lock = build_lock(cls, args, kwargs) if cls._plan.plain else cls.lock(*args, **kwargs)
        return cls._run(lock, args, kwargs)

    @classmethod
    async def arun(cls, *args: Any, **kwargs: Any) -> Any:
        """:meth:`run`, awaited: ``perform`` (async or not) runs in this event loop, under the locks.

        The store is awaited (Redis through ``redis.asyncio``, files in a thread); the
        run lock's heartbeat renews on its own thread, whatever else the loop is doing.
        """
        lock = build_lock(cls, args, kwargs) if cls._plan.plain else cls.lock(*args, **kwargs)
        return await adrive(lock.backend, cls._run_steps(lock, args, kwargs))

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
            _refuse_sync(cls, "execute")
        return drive(lock.backend, cls._execute_steps(lock, args, kwargs, settle))

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
        return await adrive(lock.backend, cls._execute_steps(lock, args, kwargs, settle))

    @classmethod
    def _execute_steps(
        cls,
        lock: JobLock,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        settle: Callable[[BaseException | None, Any], Any] | None = None,
    ) -> Steps[Any]:
        if cls.concurrency_limit is not None and not _concurrency.holding(lock):
            # a concurrency slot first; it wraps this very call (the slot is always released after)
            body = cls._execute_steps(lock, args, kwargs, settle)
            return (yield from _concurrency.execute_steps(cls, lock, args, kwargs, body, settle=settle))
        try:
            yield from lock.start_steps()
        except JobNotUnique:
            run = lock.conflict.run if lock.conflict is not None else None
            if run is not None and run.token == lock.token:
                # This very job is running elsewhere (a broker delivered it twice): not
                # a duplicate call to reschedule or report, just a copy to skip.
                log.warning("%s: skipped a second delivery of %s, still running", cls.job_name(), lock.key)
                return None
            yield from lock.dequeue_steps()
            return (yield (_conflicts.apply, (cls, lock, args, kwargs), _NONE))
        except Exception as exc:  # the store failed: give back what the call holds, then say so
            yield from _settle_failed_start_steps(lock, settle, exc)
            raise
        except BaseException:  # cancelled with the start sent: it may be applied
            if _concurrency.is_inline(lock):
                lock.undo_start()
            raise
        if settle is None:
            return (yield from _perform_steps(cls, lock, args, kwargs, release=True))
        try:
            result = yield from _perform_steps(cls, lock, args, kwargs, release=False)
        except BaseException as exc:
            yield (settle, (exc, None), _NONE)
            raise
        yield (settle, (None, result), _NONE)
        return result

    @classmethod
    def _run(cls, lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        return drive(lock.backend, cls._run_steps(lock, args, kwargs))

    @classmethod
    def _run_steps(cls, lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]) -> Steps[Any]:
        _concurrency.mark_inline(lock)  # a concurrency "block" waits in this process
        while True:
            if lock.strategy == "until_executed" and cls.concurrency_limit is None:
                # the common case in one step: both locks at once
                if (yield from lock.acquire_steps(run=True)):
                    return (yield from _perform_steps(cls, lock, args, kwargs, release=True))
                result = yield (_conflicts.apply, (cls, lock, args, kwargs), _NONE)
            elif cls.unique_strategy != "while_executing" and not (yield from lock.acquire_steps()):
                result = yield (_conflicts.apply, (cls, lock, args, kwargs), _NONE)
            else:
                result = yield from cls._execute_steps(lock, args, kwargs)
            if result is not _conflicts.RESCHEDULED:
                return result
            # inline, "reschedule" waits in this process and tries again
            yield sleep_of(cls.unique_reschedule_delay, _pause)

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


def _perform_steps(
    cls: type[UniqueJob], lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any], *, release: bool
) -> Steps[Any]:
    """Perform under the locks already taken (as ``with lock.running(started=True, release=...)``)."""
    yield from lock.hold_steps(started=True, release=release)
    try:
        result = yield (cls.invoke, (args, kwargs), _NONE)
    finally:
        yield from lock.unhold_steps(release=release)
    return result


def _pause(seconds: float) -> None:
    _sleep(seconds)  # looked up at each call: tests replace the module's _sleep


def _refuse_sync(cls: type[UniqueJob], entry: str) -> None:
    raise ConfigurationError(
        f"{cls.__qualname__}.perform is an async function: call it through the asyncio API "
        f"(await {cls.__qualname__}.a{entry}(...)); {entry}() would not await it"
    )


def _settle_failed_start_steps(
    lock: JobLock, settle: Callable[[BaseException | None, Any], Any] | None, exc: Exception
) -> Steps[None]:
    """``lock.start()`` failed: drop an inline call's queued lock; settle a delivery as a failed one.

    Left behind, an inline call's queued lock (no queue can prove it gone, no
    expiry unless autoexpire) would refuse its key for good. As steps: on the
    asyncio path the store is awaited and an async queue's ``settle`` too.
    """
    if _concurrency.is_inline(lock):
        yield from _concurrency.undo_inline_steps(None, lock)
    elif settle is not None:
        yield (settle, (exc, None), _NONE)
    else:
        yield from lock.release_steps()


def _check_perform(cls: type[UniqueJob]) -> None:
    """Refuse a job class that inherits ``UniqueJob.perform``: every call of it would fail."""
    if getattr(cls, "perform", None) is not getattr(UniqueJob, "perform", None):
        return
    raise ConfigurationError(
        f"{cls.__module__}.{cls.__qualname__} defines no perform(): define the job's work as"
        f" perform(self, ...), or, for a base class of jobs, declare it abstract:"
        f" class {cls.__name__}(UniqueJob, abstract=True)"
    )
