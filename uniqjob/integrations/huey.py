"""Huey integration: unique tasks and periodic tasks with ``@huey.task(unique=True)``; see docs/huey.md.

::

    huey = UniqueRedisHuey("app", url="redis://localhost:6379/0")

    @huey.task(unique=True, retries=2, unique_lock_autoexpire=3600)
    def export(account_id: int) -> str: ...

    export(42)   # takes the queue lock, then enqueues; a huey Result, or None for a duplicate

:class:`UniqueHuey` takes a unique task's lock in ``enqueue``, which every way in
goes through (a call, ``schedule()``, pipelines, the periodic scheduler). The
lock's key and token travel in the task's kwargs; the consumer runs the task
under it, keeps it while Huey means to retry the task, and releases it when
the task is done for good, revoked, expired or cancelled. A periodic task's
key names the minute its scheduler matched: several consumers enqueue it once
per tick.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from functools import partial
from typing import Any, ClassVar

try:
    from huey import RedisHuey
    from huey.api import Huey, PeriodicTask, Result, Task, TaskWrapper
    from huey.exceptions import CancelExecution, RateLimitExceeded, RetryTask
    from huey.signals import SIGNAL_CANCELED, SIGNAL_EXPIRED, SIGNAL_REVOKED
    from huey.utils import normalize_time
except ModuleNotFoundError as exc:  # the optional extra
    raise ModuleNotFoundError(
        f"uniqjob.integrations.huey needs huey ({exc.name} is missing): pip install 'uniqjob[huey]'",
        name=exc.name,
    ) from exc

from ..errors import ConfigurationError
from ..functions import _CALLABLES
from ..job import Queue, UniqueJob
from ..joblock import JobLock
from ..stores._log import get_logger
from . import HEADER, SETTING_PREFIXES, Decision, Ticket, in_context, perform, release_gone

__all__ = ["HueyJob", "HueyQueue", "UniqueHuey", "UniqueRedisHuey", "UniqueTaskWrapper"]

log = get_logger(__name__)

#: Seconds a periodic task's tick stays locked from its enqueue: the rest of its minute and
#: the other consumers' clocks' skew (their schedulers fire anywhere in the minute).
PERIODIC_AUTOEXPIRE = 120.0

# The task being enqueued through UniqueHuey.enqueue, for HueyQueue.push to send.
_pending: ContextVar[Task | None] = ContextVar("uniqjob_huey_task", default=None)
# The task a consumer is running in this context (given to a context=True task's function).
_running: ContextVar[Task | None] = ContextVar("uniqjob_huey_running", default=None)
# Set on a task whose body raised CancelExecution: its lock is settled; the "canceled" signal
# that follows is not a drop (one from a pre-execute hook is: the task never ran).
_RAN = "uniqjob_ran"


class HueyJob(UniqueJob, abstract=True):
    """Base of the UniqueJob made for each unique task, ``task.unique_job``."""

    #: True for a task declared with ``context=True``: its function gets the Huey task as ``task``.
    context: ClassVar[bool] = False

    @classmethod
    def invoke(cls, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Call the function; with ``context=True``, given the task being run (whatever arguments
        "keep_last" gave the call)."""
        return super().invoke(args, {**kwargs, "task": _running.get()} if cls.context else kwargs)

    @classmethod
    def job_name(cls) -> str:
        """The task function's ``module.QualName``, which starts its keys."""
        return f"{cls.__module__}.{cls.__qualname__.removesuffix('.unique_job')}"


class HueyQueue(Queue):
    """Huey as the queue of one unique task (every unique task has one; no need to make it)."""

    def __init__(self, huey: UniqueHuey, task_class: type[Task]) -> None:
        self.huey = huey
        self.task_class = task_class

    def __repr__(self) -> str:
        return f"HueyQueue({self.huey.name!r}, {self.task_class.__name__})"

    #: Ids chosen before the claim, which records them; see :attr:`uniqjob.queues.Queue.suspect_after`.
    suspect_after: float | None = 60.0

    def _task(self) -> Task | None:
        task = _pending.get()
        return task if type(task) is self.task_class else None

    def new_job_id(self) -> str:
        """The id of the Huey task being enqueued (yours, ``schedule(id=...)``, or Huey's uuid)."""
        task = self._task()
        return str(task.id) if task is not None else str(uuid.uuid4())

    def pending_delay(self) -> float:
        """Seconds until the task being enqueued is due (``schedule(delay=...)``, ``eta``); 0 if now."""
        task = self._task()
        eta: datetime | None = None if task is None else task.eta
        return 0.0 if eta is None else max((eta - _now(self.huey)).total_seconds(), 0.0)

    def push(
        self,
        job_cls: type[UniqueJob],
        lock: JobLock,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        delay: float | None = None,
    ) -> Any:
        """Enqueue the task into Huey with the lock's key and token in its kwargs; return Huey's Result.

        ``delay``: due that many seconds from now (see :meth:`push_in`).
        """
        task = self._task()
        if task is None or task.id != lock.meta.job_id:  # a parked or pending call: a task of its own
            task = self.task_class(args, dict(kwargs), id=lock.meta.job_id or None)
        if delay is not None:
            task.eta = normalize_time(delay=max(delay, 0.0), utc=self.huey.utc)
        task.kwargs[HEADER] = Ticket(lock.key, lock.token).dump()
        try:
            return super(UniqueHuey, self.huey).enqueue(task)
        except BaseException:
            del task.kwargs[HEADER]  # never sent: the task is still the caller's, unlocked
            raise

    #: :meth:`push`, the task due ``delay`` seconds from now (``unique_debounce``): Huey's schedule.
    push_in = push

    def handle(self, job_id: str) -> Result | None:
        """Huey's ``Result`` of task ``job_id``, made without a round trip (policies "use_existing",
        "keep_last"); None if this Huey keeps no results. Read it with ``get(preserve=True)``: a plain
        ``get()`` takes the result out of Huey's store, and the next reader waits for nothing."""
        return Result(self.huey, self.task_class(id=job_id)) if self.huey.results else None

    def remove(self, job_id: str) -> None:
        """Revoke task ``job_id`` once (policy "replace"): the consumer skips it when it comes up."""
        self.huey.revoke_by_id(job_id, revoke_once=True)

    def push_later(
        self, job_cls: type[UniqueJob], args: tuple[Any, ...], kwargs: dict[str, Any], delay: float
    ) -> Any:
        """Schedule the call, with no lock, ``delay`` seconds from now: it takes its lock when it is due.

        Huey's scheduler enqueues it then, through :meth:`UniqueHuey.enqueue`; one due at once
        is enqueued so by the consumer that dequeues it.
        """
        eta = normalize_time(delay=max(delay, 0.0), utc=self.huey.utc)
        return super(UniqueHuey, self.huey).enqueue(self.task_class(args, dict(kwargs), eta=eta))

    @property
    def proves_jobs_gone(self) -> bool:
        """False: a revoked task is proved gone, a task lost from Huey's queue (a flush) is not."""
        return False

    def job_gone(self, job_id: str) -> bool:
        """True if Huey task ``job_id`` is revoked for good (not just until a time to come)."""
        try:
            return bool(self.huey.is_revoked(job_id, timestamp=datetime.max))
        except Exception:  # when in doubt, never delete
            log.warning("cannot tell whether huey task %s is gone; keeping its lock", job_id, exc_info=True)
            return False


class UniqueTaskWrapper(TaskWrapper):  # type: ignore[misc]  # huey ships no type information
    """Huey's task wrapper, which makes a task unique when it is given ``unique=True``."""

    #: The UniqueJob of a unique task: its settings, keys and locks.
    unique_job: type[UniqueJob] | None = None

    def create_task(
        self, func: Any, context: bool = False, name: str | None = None, **settings: Any
    ) -> type[Task]:
        """Huey's task class; for a unique task, one whose ``execute`` runs under the task's lock."""
        unique = settings.pop("unique", False)
        options = {key: settings.pop(key) for key in list(settings) if key.startswith(SETTING_PREFIXES)}
        task_class: type[Task] = super().create_task(func, context, name, **settings)
        if not unique:
            if options:
                raise ConfigurationError(
                    f"huey task {func.__module__}.{func.__qualname__} has {', '.join(options)}"
                    " but is not unique: add unique=True"
                )
            return task_class
        job = self.unique_job = _job_for(self, task_class, func, options)
        task_class.unique_job = job
        task_class.execute = lambda task: _execute(self, job, task)
        return task_class


class UniqueHuey(Huey):  # type: ignore[misc]
    """A Huey whose tasks may be unique (``@huey.task(unique=True)``); mix it in before a storage's Huey.

    ``class AppHuey(UniqueHuey, PriorityRedisHuey): ...``; or :class:`UniqueRedisHuey`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.signal(SIGNAL_REVOKED, SIGNAL_EXPIRED, SIGNAL_CANCELED)(_dropped)

    def get_task_wrapper_class(self) -> type[TaskWrapper]:
        return UniqueTaskWrapper

    def enqueue(self, task: Any) -> Any:
        """Enqueue ``task``; a unique one takes its queue lock first: None when it is a dropped duplicate.

        A task that carries its lock already (a retry, a scheduled task come due) goes straight on.
        """
        job: type[UniqueJob] | None = getattr(type(task), "unique_job", None)
        if job is None or HEADER in task.kwargs:
            return super().enqueue(task)
        with in_context(_pending, task):  # (a scheduled task's lock outlives its wait: pending_delay)
            return job.enqueue(*task.args, **task.kwargs)


class UniqueRedisHuey(UniqueHuey, RedisHuey):  # type: ignore[misc]
    """``RedisHuey`` whose tasks may be unique."""


def _job_for(
    wrapper: UniqueTaskWrapper, task_class: type[Task], func: Any, options: dict[str, Any]
) -> type[HueyJob]:
    """Make the UniqueJob of a task: its ``perform`` is the function, its settings the task's options."""
    body: dict[str, Any] = {
        name: staticmethod(value) if name in _CALLABLES and inspect.isfunction(value) else value
        for name, value in options.items()
    }
    where = f"huey task {func.__module__}.{func.__qualname__}"
    if "unique_queue" in body:
        raise ConfigurationError(f"{where}: its queue is Huey's")
    if body.get("unique_on_conflict") == "use_existing" and not wrapper.huey.results:
        raise ConfigurationError(
            f"{where}: unique_on_conflict 'use_existing' gives a duplicate the Result of the task on its"
            " way, and this Huey keeps no results (results=False)"
        )
    if issubclass(task_class, PeriodicTask):
        if body.get("unique_on_conflict") == "reschedule":
            raise ConfigurationError(
                f"periodic {where}: unique_on_conflict"
                " 'reschedule' would run a tick's duplicate in a later tick; drop it"
            )
        body.setdefault("unique_strategy", "until_expired")  # the tick's lock outlives its run
        body.setdefault("unique_lock_autoexpire", PERIODIC_AUTOEXPIRE)
        body["unique_key"] = staticmethod(partial(_minute, wrapper.huey))
    body.update(
        __module__=func.__module__,
        # importable by that path (a parked call names its job class)
        __qualname__=f"{func.__qualname__}.unique_job",
        __doc__=func.__doc__,
        perform=staticmethod(func),
        context=wrapper.context,
        unique_queue=HueyQueue(wrapper.huey, task_class),
    )
    return type(func.__name__, (HueyJob,), body)


def _now(huey: Huey) -> datetime:
    """Now on Huey's clock: naive, UTC unless the Huey was made with ``utc=False``."""
    return datetime.now(UTC).replace(tzinfo=None) if huey.utc else datetime.now()


def _minute(huey: Huey, *args: Any, **kwargs: Any) -> datetime:
    """A periodic task's key: the minute its scheduler matched, on Huey's clock."""
    return _now(huey).replace(second=0, microsecond=0)


def _execute(wrapper: UniqueTaskWrapper, job: type[UniqueJob], task: Task) -> Any:
    """What a consumer runs for a unique task: the function, under the lock the task carries."""
    kwargs = dict(task.kwargs)
    data = kwargs.pop(HEADER, None)
    if data is None:
        # Due with no lock (a rescheduled duplicate, or a task enqueued around uniqjob):
        # enqueued again, through its lock, as any new call.
        wrapper.huey.enqueue(task)
        return None
    lock = Ticket.load(data, f"huey task {task.id}").lock(job, task.id)
    with in_context(_running, task):
        return perform(job, lock, task.args, kwargs, partial(_decide, task))


def _decide(task: Task, exc: BaseException | None, result: Any) -> Decision:
    """Seconds until Huey runs ``task`` again after this attempt, or None if it never will (Huey's rules)."""
    if exc is None:
        return None
    retry = isinstance(exc, Exception) and bool(task.retries)  # KeyboardInterrupt: the consumer stops
    if isinstance(exc, RetryTask):
        retry = True
    elif isinstance(exc, RateLimitExceeded):
        retry = retry or exc.retry
    elif isinstance(exc, CancelExecution):
        setattr(task, _RAN, True)
        retry = retry if exc.retry is None else exc.retry
    if not retry:
        return None
    # (the delay only lengthens the autoexpire of the lock that waits: near enough is good)
    delay: float = getattr(exc, "delay", None) or task.retry_delay or 0
    return float(delay)


def _dropped(signal: str, task: Any, *args: Any, **kwargs: Any) -> None:
    """A unique task Huey will not run (revoked, expired, cancelled before it ran): free its lock and slot."""
    job: type[UniqueJob] | None = getattr(type(task), "unique_job", None)
    data = task.kwargs.get(HEADER) if job is not None else None
    if job is None or data is None or vars(task).pop(_RAN, False):
        return
    lock = Ticket.load(data, f"{signal} huey task {task.id}").lock(job)
    release_gone(job, lock, task.args, {k: v for k, v in task.kwargs.items() if k != HEADER})
