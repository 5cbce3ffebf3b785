"""Django integration: unique tasks of Django's tasks framework, on whichever backend runs them.

``django.tasks`` (Django 6+) or, before it, the ``django-tasks`` backport. The project
wraps its task backend in ``TASKS``, and every ``@task`` of it is unique::

    TASKS = {
        "default": {
            "BACKEND": "uniqjob.integrations.django.UniqueBackend",
            "OPTIONS": {
                "backend": "django_tasks_db.DatabaseBackend",  # the backend that runs the tasks
                "unique_backend": "redis://localhost:6379/0",  # where the locks live
                "unique_lock_autoexpire": 3600,  # any unique_* setting: every task's default
                # ... and the wrapped backend's own options
            },
        }
    }

    @task(unique_args=("account_id",), unique_on_conflict="raise")
    def send_report(account_id: int, note: str = "") -> str: ...

    send_report.enqueue(42)  # takes the lock, then enqueues; None for a duplicate the policy drops

The lock's key and token travel in the task's keyword arguments (:data:`TICKET`);
the task, called by any worker, runs its function under that lock. Django's tasks
have no retries: a task that raises :class:`Retry` is enqueued again, deferred, its
lock kept for it. Misconfigurations are system check errors (``manage.py check``).
docs/django.md has the rules.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, ClassVar, cast

from ...errors import ConfigurationError
from ...job import UniqueJob
from ...joblock import JobLock
from .. import SETTING_PREFIXES, Ticket, in_context, perform
from ._base import (
    BaseTaskBackend,
    ImproperlyConfigured,
    Task,
    TaskResult,
    checks,
    import_string,
    sync_to_async,
    task_backends,
    timezone,
)  # fmt: skip
from ._checks import park_refusal, refusal, settings_problems
from ._taskqueue import AGAIN, TICKET, TaskQueue, _backend, _chosen, _pending

__all__ = ["AGAIN", "TICKET", "Retry", "TaskJob", "TaskQueue", "UniqueBackend", "UniqueTask", "task_backends"]

#: The context a worker gave the task it runs last in this context (``takes_context=True``).
_context: ContextVar[Any] = ContextVar("uniqjob_django_context", default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class UniqueTask(Task):  # type: ignore[misc]
    """The task class of a :class:`UniqueBackend` (``@task`` makes them): ``enqueue`` takes its lock.

    Its fields beyond Django's are the task's own uniqjob settings (None: the
    backend's ``unique_*`` option, else UniqueJob's default), given as ``@task``
    options. The lock is the task's own business: ``call`` (what a worker runs)
    holds it while the function runs.
    """

    unique_args: tuple[str, ...] | None = None
    unique_key: Callable[..., Any] | None = None
    unique_on_conflict: str | None = None
    unique_lock_autoexpire: float | timedelta | None = None
    unique_strategy: str | None = None
    unique_lock_limit: int | None = None
    unique_run_lease: float | None = None
    unique_reschedule_delay: float | None = None
    unique_debounce: float | timedelta | None = None
    unique_debounce_max_wait: float | timedelta | None = None
    concurrency_limit: int | None = None
    concurrency_key: Callable[..., Any] | None = None
    concurrency_duration: float | timedelta | None = None
    concurrency_on_conflict: str | None = None

    @property
    def unique_job(self) -> type[TaskJob]:
        """The task's UniqueJob: its settings, keys and locks (``send_report.unique_job.lock_key(42)``)."""
        return _job_of(self)

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task under the lock its ticket names (a worker's call); with no ticket, plainly."""
        ticket = kwargs.pop(TICKET, None)
        if ticket is None:  # task.call() in a test or a shell, or a task enqueued before uniqjob was
            return Task.call(self, *args, **kwargs)
        if self.takes_context:  # Django's context: TaskJob.invoke gives it first, whatever the arguments
            _context.set(args[0])
            args = args[1:]
        if ticket == AGAIN:
            result = self.enqueue(*args, **kwargs)
            return None if result is None else str(result.id)
        job = self.unique_job
        lock = Ticket.load(ticket, f"task {self.module_path}").lock(job)
        try:
            return perform(job, lock, args, kwargs, _decide)
        except Retry as retry:  # the lock is queued again: now the task may follow it
            self._again(lock, args, kwargs, retry.delay)
            raise

    def _again(self, lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any], delay: float) -> None:
        """Enqueue this task to run again in ``delay`` seconds, under the lock it keeps."""
        later = self.using(run_after=timezone.now() + timedelta(seconds=delay))
        kwargs = {**kwargs, TICKET: Ticket(lock.key, lock.token).dump()}
        result = _backend(self).enqueue_wrapped(later, args, kwargs)
        lock.meta = replace(lock.meta, job_id=str(result.id))
        lock.attach()  # the lock's job is the retry now: the next enqueue asks about it

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`call`, from an event loop (an async function runs in its own, as Task.call does)."""
        return await sync_to_async(self.call)(*args, **kwargs)


class Retry(Exception):
    """Raise it in a unique task to run the task again in ``delay`` seconds, its lock kept meanwhile.

    Django's tasks have no retries: a task that enqueues itself again is a duplicate of its
    own running call, and dropped. This attempt ends as failed (its result says Retry).
    """

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(delay)
        self.delay = delay

    def __str__(self) -> str:
        return f"to be run again in {self.delay:g}s"


def _decide(exc: BaseException | None, result: Any) -> float | None:
    """What the end of one run means for its lock: kept for a Retry's next run, else released."""
    return exc.delay if isinstance(exc, Retry) else None


class TaskJob(UniqueJob, abstract=True):
    """Base of the UniqueJob made for each unique task: the task's settings, keys and locks."""

    #: The task (its function) this job stands for.
    task: ClassVar[UniqueTask]

    @classmethod
    def job_name(cls) -> str:
        """The task's ``module.function``, which starts its keys."""
        return str(cls.task.module_path)

    @classmethod
    def invoke(cls, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Run the task's function (awaited in a loop of its own if it is ``async def``, as Django does),
        given first the context of the run if it takes one."""
        return Task.call(cls.task, *((_context.get(),) if cls.task.takes_context else ()), *args, **kwargs)


# The task settings, and the backend's unique_* options, that a TaskJob takes.
_TASK_SETTINGS = tuple(name for name in UniqueTask.__dataclass_fields__ if name.startswith(SETTING_PREFIXES))
_jobs: dict[tuple[Any, ...], type[TaskJob]] = {}


def _job_of(task: UniqueTask, backend: UniqueBackend | None = None) -> type[TaskJob]:
    """The TaskJob of a task (on ``backend``, its own): made once per function, backend and settings."""
    backend = backend or cast(UniqueBackend, _backend(task))  # a Wrapping is a UniqueBackend
    own = tuple((name, getattr(task, name)) for name in _TASK_SETTINGS if getattr(task, name) is not None)
    cache_key = (task.func, task.takes_context, backend.alias, backend.settings_key, own)
    job = _jobs.get(cache_key)
    if job is None:
        job = _jobs[cache_key] = _make_job(task, backend, {**backend.unique_settings, **dict(own)})
    return job


def _make_job(task: UniqueTask, backend: UniqueBackend, settings: dict[str, Any]) -> type[TaskJob]:
    func = task.func
    signature = inspect.signature(func)
    params = list(signature.parameters.values())[1 if task.takes_context else 0 :]

    def perform(*args: Any, **kwargs: Any) -> Any:  # gives the key its signature: invoke runs the task
        raise NotImplementedError

    perform.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    for name in ("unique_key", "concurrency_key"):  # functions of the call's arguments
        if settings.get(name) is not None:
            settings[name] = staticmethod(settings[name])
    body = {
        "__module__": func.__module__,
        "__qualname__": f"{func.__qualname__}.unique_job",  # resolve_job finds it through the task
        "__doc__": f"The uniqjob settings, keys and locks of task {task.module_path}.",
        "perform": staticmethod(perform),
        "task": task,
        "unique_queue": TaskQueue(task, backend.chooses_ids),
        **settings,
    }
    return type(func.__name__, (TaskJob,), body)


class UniqueBackend(BaseTaskBackend):  # type: ignore[misc]
    """A task backend that makes the tasks of the backend it wraps (``OPTIONS["backend"]``) unique.

    ``UniqueBackend(...)`` is an instance of a subclass of both (``Unique`` + the
    wrapped class's name), so the wrapped backend's workers and commands take
    it for their own (``db_worker`` checks for a DatabaseBackend). ``OPTIONS``:
    ``backend`` (the dotted path of the wrapped class), ``unique_*`` (the
    uniqjob settings every task of it gets by default; ``unique_backend``: the
    lock store's URL), and the rest, which is the wrapped backend's own.
    """

    task_class = UniqueTask

    def __new__(cls, alias: str, params: dict[str, Any]) -> UniqueBackend:
        wrapped = _wrapped(params) if cls is UniqueBackend else None
        return object.__new__(_wrapping(wrapped) if isinstance(wrapped, type) else cls)

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        options = dict(params.get("OPTIONS") or {})
        options.pop("backend", None)
        settings = {name: options.pop(name) for name in list(options) if name.startswith(SETTING_PREFIXES)}
        self.unique_settings = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}
        self.problems: list[checks.CheckMessage] = []
        where = f"TASKS[{alias!r}]"
        wrapped = _wrapped(params)
        if isinstance(wrapped, str):
            self.problems.append(checks.Error(f"{where}: {wrapped}", id="uniqjob.E001", obj=self))
        self.problems += settings_problems(where, self.unique_settings, self)
        theirs = options.get("id_function")

        def chosen_id() -> Any:  # the id of the task result being pushed, chosen before its lock's claim
            job_id = _chosen.get()
            if job_id:
                _chosen.set("")  # once: a task enqueued while this one is pushed gets its own
                return job_id
            if theirs is None:
                return uuid.uuid4()
            return (import_string(theirs) if isinstance(theirs, str) else theirs)()

        options["id_function"] = chosen_id
        super().__init__(alias, {**params, "OPTIONS": options})
        #: True if the wrapped backend gives a task result the id chosen for it (django-tasks-db).
        self.chooses_ids = getattr(self, "id_function", None) is chosen_id
        self.settings_key = tuple(sorted(self.unique_settings.items()))
        if (
            "concurrency_limit" in settings
            and not isinstance(wrapped, str)
            and (refused := park_refusal(self))
        ):
            self.problems.append(checks.Error(f"{where}: {refused}", id="uniqjob.E002", obj=self))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.alias!r}>"

    def store_argv(self) -> list[str]:
        """The ``uniqjob`` command's options naming this backend's lock store (none: the default store)."""
        store = self.unique_settings.get("unique_backend")
        if store is not None and not isinstance(store, str):
            raise ConfigurationError(f"TASKS[{self.alias!r}]: unique_backend is {store!r}: give its URL")
        return [] if store is None else ["--url", store]

    def _refuse_if_misconfigured(self) -> None:
        if self.problems:
            raise ImproperlyConfigured(self.problems[0].msg)

    def validate_task(self, task: Task) -> None:
        """Django's checks of a task, then its uniqjob settings' (a ConfigurationError names a bad one)."""
        super().validate_task(task)
        if isinstance(task, UniqueTask) and not self.problems:
            refused = self.refusal(_job_of(task, self))
            if refused:
                raise ConfigurationError(f"task {task.module_path}: {refused}")

    def refusal(self, job: type[TaskJob]) -> str:
        """Why the wrapped backend cannot give ``job`` its conflict policy or debounce; "" if it can."""
        return refusal(self, job)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> Any:
        """Take the task's lock, then enqueue it on the wrapped backend; None for a dropped duplicate,
        a ``Parked`` for a call over its concurrency limit (the worker that frees a slot enqueues it)."""
        self._refuse_if_misconfigured()
        if not isinstance(task, UniqueTask):
            return self.enqueue_wrapped(task, args, kwargs)
        with in_context(_pending, task):
            return _job_of(task, self).enqueue(*args, **kwargs)

    async def aenqueue(self, task: Task, args: Any, kwargs: Any) -> Any:
        """:meth:`enqueue`, from an event loop."""
        return await sync_to_async(self.enqueue, thread_sensitive=True)(task, args, kwargs)

    def enqueue_wrapped(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """The wrapped backend's own ``enqueue``: no lock."""
        self._refuse_if_misconfigured()
        return super().enqueue(task, args, kwargs)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        """The wrapped backend's checks, then uniqjob's (``manage.py check``): errors ``uniqjob.E00n``."""
        yield from super().check(**kwargs)
        yield from self.problems


def _wrapped(params: dict[str, Any]) -> type[BaseTaskBackend] | str:
    """The class named by ``OPTIONS["backend"]``, or what is wrong with it."""
    path = (params.get("OPTIONS") or {}).get("backend")
    if not path:
        return (
            "OPTIONS has no 'backend': name the task backend that runs the tasks,"
            " e.g. 'django_tasks_db.DatabaseBackend'"
        )
    try:
        found: object = import_string(path)
    except ImportError as exc:
        return f"OPTIONS['backend'] {path!r} cannot be imported: {exc}"
    if not (isinstance(found, type) and issubclass(found, BaseTaskBackend)) or found is UniqueBackend:
        return f"OPTIONS['backend'] {path!r} is not a task backend (a BaseTaskBackend, not UniqueBackend)"
    return found


_wrappings: dict[type[BaseTaskBackend], type[UniqueBackend]] = {}


def _wrapping(wrapped: type[BaseTaskBackend]) -> type[UniqueBackend]:
    """The class of a UniqueBackend wrapping ``wrapped``: a subclass of both, made once."""
    made = _wrappings.get(wrapped)
    if made is None:
        name = f"Unique{wrapped.__name__}"
        made = _wrappings[wrapped] = type(name, (UniqueBackend, wrapped), {"__module__": __name__})
    return made
