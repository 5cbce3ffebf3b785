"""Celery integration: unique tasks with ``@app.task(base=UniqueTask)``; docs/celery.md has the rules.

::

    @app.task(base=UniqueTask, unique_lock_autoexpire=3600)
    def export(account_id: int) -> None: ...

    export.delay(42)   # takes the queue lock, then publishes; None for a duplicate

The lock's key and token travel in a message header; the worker runs the task
under that lock. ``self.retry()`` keeps it (and a concurrency slot) for the
retry; success, final failure and ``revoke`` release them. The settings live
on ``task.unique_job``, a :class:`UniqueJob` made for each task class. Celery
cannot prove a queued task gone (a purged queue): its lock is kept until
``unique_lock_autoexpire``, which Celery tasks should therefore set.
"""

from __future__ import annotations

import inspect
import numbers
import threading
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, ClassVar, Final

try:
    from celery import Task, shared_task
    from celery.exceptions import Reject, Retry
    from celery.signals import task_revoked, worker_init, worker_ready
except ModuleNotFoundError as exc:  # the optional extra
    raise ModuleNotFoundError(
        f"uniqjob.integrations.celery needs celery ({exc.name} is missing): pip install 'uniqjob[celery]'",
        name=exc.name,
    ) from exc

from .. import _job_sync, _percall
from ..concurrency import _job as _concurrency
from ..errors import ConfigurationError
from ..functions import _CALLABLES
from ..job import Queue, UniqueJob
from ..joblock import JobLock
from ..locks import holder_is_dead, orphaned
from ..ops._locks import reclaim
from ..stores._log import get_logger
from . import HEADER, KEEP, SETTING_PREFIXES, Decision, Ticket, in_context, perform, settle

__all__ = ["CeleryQueue", "UniqueTask"]

log = get_logger(__name__)

#: The task that runs a rescheduled call's second try (policy "reschedule").
ENQUEUE_LATER: Final = "uniqjob.enqueue_later"


@dataclass(frozen=True)
class _Call:
    """An ``apply_async`` on its way through ``UniqueJob.enqueue`` to :meth:`CeleryQueue.push`."""

    job: type[UniqueJob]
    task_id: str
    options: dict[str, Any] = field(default_factory=dict)
    delay: float = 0.0


_pending: ContextVar[_Call | None] = ContextVar("uniqjob_celery_call", default=None)
_running: ContextVar[Task | None] = ContextVar("uniqjob_celery_task", default=None)


class TaskJob(UniqueJob, abstract=True):
    """Base of the :class:`UniqueJob` made for each UniqueTask class: its settings, keys and locks."""

    #: The UniqueTask class this job stands for.
    task_cls: ClassVar[type[UniqueTask]]

    @classmethod
    def job_name(cls) -> str:
        """The task class's ``module.QualName``, which starts its keys."""
        return f"{cls.__module__}.{cls.task_cls.__qualname__}"

    @classmethod
    def invoke(cls, args: Any, kwargs: dict[str, Any]) -> Any:
        """Run the task's body: the ``run`` of the task instance that Celery is executing."""
        task = _running.get()
        if task is None or not isinstance(task, cls.task_cls):
            raise ConfigurationError(
                f"{cls.job_name()} is a Celery task: call delay()/apply_async(), or call it as a function"
            )
        return task.run(*args, **kwargs)


class CeleryQueue(Queue):
    """Celery as the queue of one UniqueTask class (every UniqueTask has one; no need to make it)."""

    def __init__(self, task_cls: type[UniqueTask]) -> None:
        self.task_cls = task_cls

    def __repr__(self) -> str:
        return f"CeleryQueue({self.task_cls.__qualname__})"

    @property
    def task(self) -> UniqueTask:
        """The registered instance of the task class."""
        app = self.task_cls.app
        name = self.task_cls.name
        try:
            task: UniqueTask = app.tasks[name]
        except KeyError:
            raise ConfigurationError(f"task {name!r} is not registered with {app!r}") from None
        return task

    def _call(self) -> _Call | None:
        """The ``apply_async`` of this task being enqueued in this context, if any."""
        call = _pending.get()
        return call if call is not None and _percall.origin(call.job) is self.task_cls.unique_job else None

    #: Ids chosen before the claim, which records them (no attach after the publish). Celery
    #: cannot tell a lost task (:attr:`proves_jobs_gone` is False): nothing is ever asked.
    suspect_after: float | None = 60.0

    def new_job_id(self) -> str:
        """The Celery task id the message will have (the caller's ``task_id``, if it gave one)."""
        call = self._call()
        return call.task_id if call is not None else str(uuid.uuid4())

    def pending_delay(self) -> float:
        """Seconds until the task being published is due: its ``countdown`` or ``eta`` (0 if none)."""
        call = self._call()
        return call.delay if call is not None else 0.0

    def push(
        self,
        job_cls: type[UniqueJob],
        lock: JobLock,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        delay: float | None = None,
    ) -> Any:
        """Publish the task with the lock's key and token in a message header; return its AsyncResult."""
        call = _pending.get()
        options = dict(call.options) if call is not None and call.job is job_cls else {}
        if delay is not None:  # push_in's
            options = {k: v for k, v in options.items() if k != "eta"} | {"countdown": delay}
        headers = dict(options.pop("headers", None) or {})
        headers[HEADER] = Ticket(lock.key, lock.token).dump()
        return Task.apply_async(
            self.task, args, kwargs, task_id=lock.meta.job_id or None, headers=headers, **options
        )

    #: :meth:`push` with a ``countdown`` of ``delay`` seconds (``unique_debounce``).
    push_in = push

    def handle(self, job_id: str) -> Any:
        """The task's ``AsyncResult`` of ``job_id`` (policies "use_existing", "keep_last"; no round trip)."""
        return self.task.AsyncResult(job_id)

    def remove(self, job_id: str) -> None:
        """Revoke task ``job_id`` (policy "replace"): workers discard it when it reaches them."""
        self.task.app.control.revoke(job_id)

    def push_later(
        self, job_cls: type[UniqueJob], args: tuple[Any, ...], kwargs: dict[str, Any], delay: float
    ) -> Any:
        """Publish a small task that calls ``apply_async`` again in ``delay`` seconds, on the task's queue."""
        task = self.task
        call = _pending.get()
        options = dict(call.options) if call is not None and call.job is job_cls else {}
        route = task.app.amqp.router.route(
            {"queue": options["queue"]} if "queue" in options else {}, task.name
        )
        queue = route.get("queue")
        return task.app.send_task(
            ENQUEUE_LATER,
            (task.name, list(args), dict(kwargs)),
            countdown=delay if delay > 0 else None,
            queue=getattr(queue, "name", queue),
        )


class UniqueTask(Task):  # type: ignore[misc]  # celery ships no type information
    """Base class of unique Celery tasks: ``@app.task(base=UniqueTask)`` or ``class T(UniqueTask)``.

    ``delay`` / ``apply_async`` return the AsyncResult, or None when the call
    is a duplicate that the conflict policy drops.
    """

    #: The UniqueJob that holds this task's settings and makes its keys and locks.
    unique_job: ClassVar[type[TaskJob]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.unique_job = _job_for(cls)

    def apply_async(
        self,
        args: Any = None,
        kwargs: dict[str, Any] | None = None,
        task_id: str | None = None,
        **options: Any,
    ) -> Any:
        """Take the queue lock, then publish the task; None for a duplicate the policy drops.

        ``unique_*`` options are uniqjob settings for this call (``unique_on_conflict``,
        ``unique_lock_autoexpire``, ``unique_reschedule_delay``; see
        :meth:`UniqueJob.using <uniqjob.job.UniqueJob.using>`), checked, applied, and not
        handed to Celery; any other ``unique_*`` option is a ConfigurationError naming it.
        """
        args = tuple(args or ())
        kwargs = dict(kwargs or {})
        settings = {name: options.pop(name) for name in list(options) if name.startswith("unique_")}
        job = _percall.using(self.unique_job, settings, prefix="unique_", where=f"{self.name}.apply_async()")
        headers = options.get("headers") or {}
        if HEADER in headers:  # a message that already holds its lock: self.retry()
            return self._resend(args, kwargs, task_id, options)
        call = _Call(job, task_id or str(uuid.uuid4()), options, _delay(options))
        with in_context(_pending, call):
            return job.enqueue(*args, **kwargs)

    def _resend(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], task_id: str | None, options: Any
    ) -> Any:
        request = self.request
        lock: JobLock | None = getattr(request, "_uniqjob_lock", None)
        ticket = Ticket.load(options["headers"][HEADER], f"task {self.name}[{task_id}]")
        retrying = False
        if lock is not None and lock.token == ticket.token and task_id == request.id:
            # self.retry() of the delivery running here: hold the key for the
            # retry, queued, before it is published, so that the retry never
            # races this process for the lock. From here on the lock is the retry's.
            settle(lock, _delay(options))
            request._uniqjob_requeued = retrying = True
        try:
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        except BaseException:
            if retrying:
                request._uniqjob_requeued = False  # no retry was sent: this delivery settles it
            raise

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:  # a plain function call in this process: no locks
            return super().__call__(*args, **kwargs)
        job = self.unique_job
        with in_context(_running, self):
            data = (request.headers or {}).get(HEADER)
            if data is None:
                # Published around uniqjob (send_task by name, another client): locked by its
                # arguments, taking over a queued lock of any token; a duplicate goes the way
                # of any conflict at execution time (the policy: logged at INFO by default).
                adopting = job.lock(*args, **kwargs)
                adopting.adopt = True
                return job.execute(adopting, args, kwargs)
            lock = Ticket.load(data, f"task {self.name}[{request.id}]").lock(job, request.id or "")
            request._uniqjob_lock = lock
            return perform(job, lock, args, kwargs, partial(_decide, request))

    def is_locked(self, *args: Any, **kwargs: Any) -> bool:
        """True when ``delay(*args, **kwargs)`` would conflict now."""
        return self.unique_job.is_locked(*args, **kwargs)


_TASK_RUN = inspect.getattr_static(Task, "run")
_BASE_NAMES = frozenset(vars(UniqueTask)) | {"unique_job"}


def _job_for(task_cls: type[UniqueTask]) -> type[TaskJob]:
    """Make the UniqueJob of a task class from its ``unique_*`` settings and its ``run``."""
    namespace: dict[str, Any] = {}
    for klass in reversed(task_cls.__mro__):
        if klass in UniqueTask.__mro__:
            continue
        namespace.update(
            (name, _setting(klass, name, value))
            for name, value in vars(klass).items()
            if name.startswith(SETTING_PREFIXES) and name not in _BASE_NAMES
        )
    if "unique_queue" in namespace:
        raise ConfigurationError(
            f"{task_cls.__qualname__}.unique_queue: a UniqueTask's queue is Celery; route it with queue=..."
        )
    run = inspect.getattr_static(task_cls, "run")
    if run is not _TASK_RUN:
        namespace["perform"] = run  # gives the key its signature; `self` of a bound run is dropped
    # A task class with no run of its own is a base of tasks (@app.task(base=...) adds the run).
    namespace.update(
        __module__=task_cls.__module__,
        # importable by that path (a parked call names its job class, see uniqjob.concurrency)
        __qualname__=f"{task_cls.__qualname__}.unique_job",
        __doc__=f"The uniqjob settings, keys and locks of Celery task {task_cls.__qualname__}.",
        task_cls=task_cls,
        unique_queue=CeleryQueue(task_cls),
    )
    return type(task_cls.__name__, (TaskJob,), namespace, abstract=run is _TASK_RUN)


def _setting(klass: type, name: str, value: Any) -> Any:
    """A setting as the task's UniqueJob holds it: a plain function given as a task option, a staticmethod.

    (``@app.task(concurrency_key=order_of)`` puts ``order_of`` on the task class as
    a plain function, which the job class would otherwise bind to itself.) A
    function defined in the task class's own body is left as written.
    """
    in_body = inspect.isfunction(value) and value.__qualname__.startswith(f"{klass.__qualname__}.")
    if name in _CALLABLES and inspect.isfunction(value) and not in_body:
        return staticmethod(value)
    return value


def _decide(request: Any, exc: BaseException | None, result: Any) -> Decision:
    """What a delivery's outcome means for its lock: done (None), kept (KEEP) or a retry in n seconds."""
    if getattr(request, "_uniqjob_requeued", False):
        return KEEP  # queued again before a retry was published: the retry's now, however this ends
    if isinstance(exc, Retry):
        return _seconds_until(exc.when)  # eager mode: the retry runs next, in this process
    if isinstance(exc, Reject) and exc.requeue:
        return 0.0  # requeued by the broker: it comes back
    return None


def _delay(options: dict[str, Any]) -> float:
    """Seconds until a task published with these options is due (countdown or eta); 0 if now."""
    countdown = options.get("countdown")
    return _seconds_until(countdown if countdown is not None else options.get("eta"))


def _seconds_until(when: Any) -> float:
    if when is None:
        return 0.0
    if isinstance(when, numbers.Real):
        return max(float(when), 0.0)
    if isinstance(when, str):
        when = datetime.fromisoformat(when)
    if not isinstance(when, datetime):
        raise ConfigurationError(f"countdown/eta must be seconds or a datetime, got {when!r}")
    if when.tzinfo is not None:
        return max((when - datetime.now(UTC)).total_seconds(), 0.0)
    # Celery reads a naive eta in its own timezone: count the later of UTC and local time.
    utc = datetime.now(UTC).replace(tzinfo=None)
    return max((when - utc).total_seconds(), (when - datetime.now()).total_seconds(), 0.0)


@task_revoked.connect  # type: ignore[untyped-decorator]
def _on_revoked(sender: Any = None, request: Any = None, terminated: bool = False, **_: Any) -> None:
    """A revoked (or expired) task never runs: release its lock and its concurrency slot.

    A terminated one's run lock goes too, as soon as the pool child that held it
    is dead, whatever the signal (the worker releases it: a child killed with
    SIGKILL has no last word); the slot is freed at once, and the oldest parked
    call promoted into it, rather than lapsing with its lease.
    """
    if not isinstance(sender, UniqueTask) or request is None:
        return
    data = (getattr(request, "headers", None) or {}).get(HEADER)
    if data is None:
        return
    job = sender.unique_job
    lock = Ticket.load(data, f"revoked task {sender.name}[{getattr(request, 'id', '?')}]").lock(job)
    lock.release()
    _job_sync.next_call(job, lock, lock.backend)  # a "keep_last" call its release queued
    if terminated:  # watched before the slot is freed: a concurrency key that raises leaves it watched
        _release_when_dead(job, lock.key, lock.token)
    # the slot is found by the concurrency key of the arguments, as on a worker that runs the task
    args, kwargs = getattr(request, "args", None) or (), getattr(request, "kwargs", None) or {}
    _concurrency.free(job, lock.token, tuple(args), dict(kwargs))


#: How often the worker looks whether a terminated task's pool child has died yet.
_DEATH_POLL = 0.01


def _release_when_dead(job: type[UniqueJob], key: str, token: str) -> None:
    """Release ``token``'s locks of ``key`` once their holder is proved dead (a terminated task's child)
    as ``uniqjob reap`` does: a "keep_last" call that waited behind it is pushed.

    The child's run lock records another attempt than this process's, so its
    release alone leaves it; and the child may not be dead yet when the signal
    was just sent (or may survive one it handles: then it keeps its lock, and
    releases it itself). So a thread of the worker watches the lock until its
    holder is dead, then reclaims it, token-checked; at most one lease long.
    """

    def watch() -> None:
        backend = job.backend()
        deadline = time.monotonic() + float(job.unique_run_lease)
        try:
            while True:
                state = backend.read(key)
                run = state.run
                if run is None or run.token != token:  # released meanwhile, lapsed, or another's
                    if state.queue is not None and state.queue.token == token and orphaned(state):
                        reclaim(backend, state)
                    return
                if holder_is_dead(run.holder):
                    reclaim(backend, state)
                    return
                if time.monotonic() > deadline:  # alive: it kept its task, and releases it itself
                    return
                time.sleep(_DEATH_POLL)
        except Exception:  # the store failed: the lock lapses with its lease, as any dead holder's
            log.warning("could not release the lock %r of a terminated task", key, exc_info=True)

    threading.Thread(target=watch, name=f"uniqjob-revoked-{key}", daemon=True).start()


# worker_ready too: a worker may import this module only while worker_init is being sent
@worker_ready.connect  # type: ignore[untyped-decorator]
@worker_init.connect  # type: ignore[untyped-decorator]
def _free_at_revoke(**_: Any) -> None:
    """In a worker: a ``revoke`` frees the locks of the tasks it names that this worker holds, at once.

    Celery itself drops a revoked task it has received but not started only
    when it next looks at it: when a pool child is free for it (after the work
    queued ahead of it), or at its eta. This wraps the worker's ``revoke``
    control command so that such a task's lock and concurrency slot go as the
    command arrives, through the same handler as Celery's own ``task_revoked``
    (which still comes later, and then finds nothing of its token to release).
    """
    from celery.app.task import Context
    from celery.worker import control
    from celery.worker import state as worker_state

    handlers = control.Panel.data  # the very dict the worker's control mailbox dispatches from
    revoke = handlers["revoke"]
    if getattr(revoke, "uniqjob_frees_locks", False):
        return

    def revoke_and_free(state: Any, task_id: Any, *args: Any, **kwargs: Any) -> Any:
        reply = revoke(state, task_id, *args, **kwargs)
        ids = set(task_id) if isinstance(task_id, list | tuple | set) else {task_id}
        for request in list(worker_state.reserved_requests):
            if request.id in ids and request not in worker_state.active_requests:
                # the task Context that task_revoked is sent, from the request's public fields
                fields = dict(request.request_dict, id=request.id, args=request.args, kwargs=request.kwargs)
                _on_revoked(sender=request.task, request=Context(fields))
        return reply

    setattr(revoke_and_free, "uniqjob_frees_locks", True)  # noqa: B010 - a marker on a function
    handlers["revoke"] = revoke_and_free


@shared_task(name=ENQUEUE_LATER, ignore_result=True)  # type: ignore[untyped-decorator]
def enqueue_later(task_name: str, args: list[Any], kwargs: dict[str, Any]) -> bool:
    """A rescheduled call's second try: ``apply_async`` it again (policy "reschedule"); True if sent."""
    from celery import current_app

    return current_app.tasks[task_name].apply_async(args, kwargs) is not None
