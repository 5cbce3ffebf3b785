"""The UniqueJob mixin: class settings, keys, enqueue and run, and the queue hooks."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, ClassVar

from . import config, settings
from ._calls import Binder, binder, describe_call
from .concurrency import _job as _concurrency
from .concurrency._job import ConcurrencyPolicy
from .concurrency.semaphore import Semaphore
from .errors import ConfigurationError, JobNotUnique, UniqueKeyError
from .joblock import JobLock, Strategy
from .keys import KEY_VERSION, KeyPlan, digest, make_key
from .locks import QueueMeta
from .queue import Queue
from .settings import ConflictPolicy
from .stores.base import Backend

__all__ = ["ConflictPolicy", "Queue", "UniqueJob"]

log = logging.getLogger(__name__)

_RESCHEDULED: Any = object()  # an inline call to try again after unique_reschedule_delay
_sleep = time.sleep  # replaced by tests


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

    _perform_signature: ClassVar[inspect.Signature | None] = None
    _perform_binder: ClassVar[Binder | None] = None  # see _calls.binder()
    _perform_bound: ClassVar[bool] = False  # perform is a classmethod or staticmethod
    _custom_key: ClassVar[bool] = False
    _key_plan: ClassVar[KeyPlan | None] = None  # the default key of a plain signature, planned once
    _plain: ClassVar[bool] = False  # overrides none of the hooks that make a lock: see _new_lock()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._custom_key = inspect.getattr_static(cls, "unique_key") is not _DEFAULT_KEY
        perform = inspect.getattr_static(cls, "perform")
        if perform is not _BASE_PERFORM:
            cls._perform_bound = isinstance(perform, (classmethod, staticmethod))
            signature = inspect.signature(cls.perform)
            if not cls._perform_bound:  # drop ``self``
                params = list(signature.parameters.values())[1:]
                signature = signature.replace(parameters=params)
            cls._perform_signature = signature
            cls._perform_binder = binder(signature)
        # Set on every class, so a subclass never keeps its parent's plan for another key.
        planned = cls._perform_signature
        if planned is not None and cls._perform_binder is not None and not cls._custom_key:
            plain_params = planned.parameters.values()
            defaults = [p.default for p in plain_params if p.default is not inspect.Parameter.empty]
            cls._key_plan = KeyPlan(list(planned.parameters), defaults)
        else:
            cls._key_plan = None
        cls._plain = all(inspect.getattr_static(cls, name) is hook for name, hook in _LOCK_HOOKS.items())
        settings.check(cls, Queue)
        _concurrency.check(cls)

    # -- the job ---------------------------------------------------------------------

    def perform(self, *args: Any, **kwargs: Any) -> Any:
        """The job's work. Override it (as a method, classmethod or staticmethod)."""
        raise NotImplementedError(f"{type(self).__qualname__} must define perform()")

    @classmethod
    def invoke(cls, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Call ``perform`` (on a new instance for a plain method) and return its result; no locks."""
        if cls._perform_bound:
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
        signature = cls._perform_signature
        if signature is None:
            raise ConfigurationError(f"{cls.__qualname__} must define perform()")
        bind = cls._perform_binder
        arguments = None if bind is None else bind(args, kwargs)
        if arguments is None:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                reason = f"arguments do not match perform{signature}: {exc}"
                raise UniqueKeyError(_param_in(str(exc)), reason) from None
            bound.apply_defaults()
            arguments = bound.arguments
        if cls.unique_args is not None:
            return {name: arguments[name] for name in cls.unique_args}
        return arguments

    @classmethod
    def lock_key(cls, *args: Any, **kwargs: Any) -> str:
        """Return the lock key of a call with these arguments."""
        plan = cls._key_plan
        values = None if plan is None else _planned_values(cls, plan, args, kwargs)
        if plan is not None and values is not None:
            # The usual call, sooner: the same key as make_key(name, unique_key(...)).
            return plan.key(cls.job_name(), values)
        value = cls.unique_key(*args, **kwargs)
        if cls._custom_key:
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
        return _new_lock(cls, args, kwargs)

    @classmethod
    def lock_from(cls, key: str, token: str | None, *, adopt: bool = False) -> JobLock:
        """Rebuild a job's lock from the key and token that travelled with it (worker side)."""
        return cls._lock(key, (), {}, token=token, adopt=adopt)

    @classmethod
    def _lock(
        cls,
        key: str,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        *,
        token: str | None = None,
        adopt: bool = False,
    ) -> JobLock:
        return JobLock(
            cls.backend(),
            key,
            token=token,
            lease=float(cls.unique_run_lease),
            ttl=cls.autoexpire(),
            meta=QueueMeta(cls.job_name(), describe_call(args, kwargs)),
            adopt=adopt,
            strategy=cls.unique_strategy,
            limit=cls.unique_lock_limit,
            on_lost=cls.unique_on_lost,
        )

    # -- the user's entry points -------------------------------------------------------

    @classmethod
    def enqueue(cls, *args: Any, **kwargs: Any) -> Any:
        """Take the queue lock and hand the job to its queue (inline: run it now).

        Returns the queue's job handle (inline: ``perform``'s result), or None
        when the call is a duplicate and the policy drops or reschedules it.
        """
        # (lock() is not overridden when _plain: straight to its body, the call not packed again)
        lock = _new_lock(cls, args, kwargs) if cls._plain else cls.lock(*args, **kwargs)
        queue = cls.unique_queue
        if queue is None:
            return cls._run(lock, args, kwargs)
        if cls.unique_strategy != "while_executing" and not lock.acquire(gone=queue.job_gone):
            return cls._conflict(lock, args, kwargs)
        try:
            # Made once the lock is ours: a duplicate needs no id, and acquire() records none.
            job_id = _concurrency.job_id(cls, queue)
            if job_id:
                meta = lock.meta
                lock.meta = QueueMeta(meta.cls, meta.args, job_id)
            if cls.concurrency_limit is None:  # no slot to take: straight to the queue
                handle = queue.push(cls, lock, args, dict(kwargs))
            else:
                handle = _concurrency.push(cls, queue, lock, args, kwargs)
        except BaseException:
            lock.dequeue()
            raise
        if lock.meta.job_id:
            lock.attach()  # the job exists now: its queue may prove it gone from here on
        return handle

    @classmethod
    def run(cls, *args: Any, **kwargs: Any) -> Any:
        """Lock, perform in this process, release; for scripts and cron.

        Returns ``perform``'s result, or None when the key is held and the policy drops the call.
        """
        lock = _new_lock(cls, args, kwargs) if cls._plain else cls.lock(*args, **kwargs)
        return cls._run(lock, args, kwargs)

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
        if cls.concurrency_limit is not None and not _concurrency.holding(lock):
            # a concurrency slot first; it wraps this very call (the slot is always released after)
            body = lambda: cls.execute(lock, args, kwargs, settle=settle)  # noqa: E731
            return _concurrency.execute(cls, lock, args, kwargs, body, settle=settle)
        try:
            lock.start()
        except JobNotUnique:
            run = lock.conflict.run if lock.conflict is not None else None
            if run is not None and run.token == lock.token:
                # This very job is running elsewhere (a broker delivered it twice): not
                # a duplicate call to reschedule or report, just a copy to skip.
                log.warning("%s: skipped a second delivery of %s, still running", cls.job_name(), lock.key)
                return None
            lock.dequeue()
            return cls._conflict(lock, args, kwargs)
        except Exception as exc:  # the store failed: give back what the call holds, then say so
            _settle_failed_start(lock, settle, exc)
            raise
        if settle is None:
            with lock.running(started=True):
                return cls.invoke(args, kwargs)
        try:
            with lock.running(started=True, release=False):
                result = cls.invoke(args, kwargs)
        except BaseException as exc:
            settle(exc, None)
            raise
        settle(None, result)
        return result

    @classmethod
    def _run(cls, lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        _concurrency.mark_inline(lock)  # a concurrency "block" waits in this process
        while True:
            if cls.unique_strategy == "until_executed" and cls.concurrency_limit is None:
                # the common case in one step: both locks at once
                if lock.acquire(run=True):
                    with lock.running(started=True):
                        return cls.invoke(args, kwargs)
                result = cls._conflict(lock, args, kwargs)
            elif cls.unique_strategy != "while_executing" and not lock.acquire():
                result = cls._conflict(lock, args, kwargs)
            else:
                result = cls.execute(lock, args, kwargs)
            if result is not _RESCHEDULED:
                return result
            # inline, "reschedule" waits in this process and tries again
            _sleep(cls.unique_reschedule_delay)

    @classmethod
    def _conflict(cls, lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        policy = cls.unique_on_conflict
        if policy == "raise":
            raise JobNotUnique(lock.key, _holder(lock))
        # A duplicate is the common case of a busy queue: the holder's facts are
        # gathered only for a log line that is written.
        if policy == "log":
            if log.isEnabledFor(logging.INFO):
                log.info("%s dropped: %s is already locked (%s)", cls.job_name(), lock.key, _holder(lock))
        elif policy == "reschedule":
            if log.isEnabledFor(logging.INFO):
                log.info("%s rescheduled: %s is already locked (%s)", cls.job_name(), lock.key, _holder(lock))
            queue = cls.unique_queue
            if queue is None:
                return _RESCHEDULED
            queue.push_later(cls, tuple(args), dict(kwargs), float(cls.unique_reschedule_delay))
        return None

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
        if lock.acquire(gone=queue.job_gone if queue is not None else None):
            return True
        cls._conflict(lock, args, kwargs)
        return False

    @classmethod
    @contextmanager
    def around_perform(cls, *args: Any, **kwargs: Any) -> Iterator[JobLock]:
        """Hold the key's locks while the body runs: the queued lock is taken over, the run lock kept alive.

        Raises :class:`JobNotUnique` if another live job holds the run lock.
        """
        lock = cls._lock(cls.lock_key(*args, **kwargs), args, kwargs, adopt=True)
        with lock.running():
            yield lock

    @classmethod
    def after_dequeue(cls, *args: Any, **kwargs: Any) -> bool:
        """Drop the key's queue lock while it is still queued (its job left the queue); True if dropped."""
        lock = cls.lock(*args, **kwargs)
        return any(lock.backend.dequeue(slot) for slot in lock.slots())

    @classmethod
    def is_locked(cls, *args: Any, **kwargs: Any) -> bool:
        """True when an enqueue with these arguments would conflict now; orphans don't count."""
        inline = cls.unique_queue is None or cls.unique_strategy == "while_executing"
        return cls.lock(*args, **kwargs).held(run_conflicts=inline)

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


def _planned_values(
    cls: type[UniqueJob], plan: KeyPlan, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Sequence[Any] | None:
    """The values ``plan`` keys a call by (perform's parameters, defaults applied); None if not planned."""
    if cls.unique_args is not None:
        return None
    given = len(args)
    if not kwargs and plan.required <= given <= plan.size:  # positional, defaults trailing
        return args + plan.defaults[given:] if given < plan.size else args
    bind = cls._perform_binder
    bound = None if bind is None else bind(args, kwargs)
    return None if bound is None else list(bound.values())  # None: the hooks raise the error


def _new_lock(cls: type[UniqueJob], args: tuple[Any, ...], kwargs: dict[str, Any]) -> JobLock:
    """The body of ``cls.lock(*args, **kwargs)``.

    For a class whose hooks are all UniqueJob's own (``_plain``), in one step:
    every enqueue makes a lock, and the layers of hooks (``lock_key``,
    ``unique_key``, ``job_name``, ``backend``, ``autoexpire``) cost more than
    the key itself once the CPU's caches have gone cold between two enqueues,
    as they have in a busy application. Any other class or call goes through
    the hooks.
    """
    plan = cls._key_plan if cls._plain else None
    values = None if plan is None else _planned_values(cls, plan, args, kwargs)
    if plan is None or values is None:
        return cls._lock(cls.lock_key(*args, **kwargs), args, kwargs)
    name = f"{cls.__module__}.{cls.__qualname__}"  # job_name()
    target = cls.unique_backend
    return JobLock(
        config.default_backend() if target is None else config.resolve(target),
        plan.key(name, values),
        lease=float(cls.unique_run_lease),
        ttl=None if cls.unique_lock_autoexpire is None else cls.autoexpire(),
        meta=QueueMeta(name, describe_call(args, kwargs)),
        strategy=cls.unique_strategy,
        limit=cls.unique_lock_limit,
        on_lost=cls.unique_on_lost,
    )


def _settle_failed_start(
    lock: JobLock, settle: Callable[[BaseException | None, Any], None] | None, exc: Exception
) -> None:
    """``lock.start()`` failed: drop an inline call's queued lock; settle a delivery as a failed one.

    Left behind, an inline call's queued lock (no queue can prove it gone, no
    expiry unless autoexpire) would refuse its key for good.
    """
    if _concurrency.is_inline(lock):
        _concurrency.undo_inline(None, lock)
    elif settle is not None:
        settle(exc, None)
    else:
        lock.release()


def _holder(lock: JobLock) -> dict[str, object]:
    return lock.conflict.describe() if lock.conflict is not None else {}


def _param_in(message: str) -> str:
    """Pull the parameter name out of a ``Signature.bind`` error, if it names one."""
    start = message.find("'")
    end = message.find("'", start + 1)
    return message[start + 1 : end] if 0 <= start < end else ""


_DEFAULT_KEY = inspect.getattr_static(UniqueJob, "unique_key")
_LOCK_HOOKS = {
    name: inspect.getattr_static(UniqueJob, name)
    for name in ("lock", "_lock", "lock_key", "unique_key", "job_name", "backend", "autoexpire")
}
_BASE_PERFORM = inspect.getattr_static(UniqueJob, "perform")
