"""The queue of a unique Django task: its backend's wrapped one, and the ticket its calls carry."""

from __future__ import annotations

import uuid
from contextvars import ContextVar
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from ...errors import ConfigurationError
from ...job import Queue, UniqueJob
from ...joblock import JobLock
from ...stores._log import get_logger
from .. import Ticket, in_context
from ._base import Task, TaskResult, TaskResultDoesNotExist, TaskResultStatus, timezone

if TYPE_CHECKING:
    from . import UniqueTask

log = get_logger(__name__)

#: The keyword argument under which a task's lock data travels (its key and token).
TICKET: Final = "_uniqjob"
#: The ticket of a rescheduled duplicate's next try (policy "reschedule"): enqueue it again.
AGAIN: Final = "again"

#: The Task being enqueued in this context (its priority, queue and run_after), and the id
#: its result gets when the wrapped backend takes ids from ``id_function`` (django-tasks-db).
_pending: ContextVar[Task | None] = ContextVar("uniqjob_django_task", default=None)
_chosen: ContextVar[str] = ContextVar("uniqjob_django_id", default="")


class TaskQueue(Queue):
    """A unique task's queue: its backend's wrapped one (every unique task has one; no need to make it)."""

    def __init__(self, task: UniqueTask, chooses_ids: bool) -> None:
        self.task = task
        self.chooses_ids = chooses_ids  # its backend gives a result the id chosen for it

    def __repr__(self) -> str:
        return f"TaskQueue({self.task.module_path!r})"

    #: See :attr:`uniqjob.queues.Queue.suspect_after`: the same rule as RQ's and arq's.
    suspect_after: float | None = 60.0

    def _pending(self) -> UniqueTask:
        """The Task being enqueued (``task.using(...)``'s priority, queue, run_after), else the task."""
        task = _pending.get()
        return task if isinstance(task, type(self.task)) and task.func is self.task.func else self.task

    def new_job_id(self) -> str:
        """A fresh id for the task result, when the wrapped backend takes it (else "": recorded after)."""
        return str(uuid.uuid4()) if self.chooses_ids else ""

    def push(
        self,
        job_cls: type[UniqueJob],
        lock: JobLock,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        delay: float | None = None,
    ) -> TaskResult:
        """Enqueue the task (deferred ``delay`` seconds) with its ticket; record its result id in the lock."""
        task = self._pending()
        if delay is not None:
            task = task.using(run_after=timezone.now() + timedelta(seconds=delay))
        kwargs = {**kwargs, TICKET: Ticket(lock.key, lock.token).dump()}
        with in_context(_chosen, lock.meta.job_id):
            result = _backend(task).enqueue_wrapped(task, args, kwargs)
        if str(result.id) != lock.meta.job_id and not result.is_finished:
            # the backend chose the id: one round trip more (immediate backends have run it already)
            lock.meta = replace(lock.meta, job_id=str(result.id))
            lock.attach()
        return result

    #: :meth:`push`, the task deferred ``delay`` seconds (``unique_debounce``: its ``run_after``).
    push_in = push

    def handle(self, job_id: str) -> TaskResult:
        """Task result ``job_id``, made without asking the backend (policies "use_existing", "keep_last"):
        it says READY until its ``refresh()`` (``arefresh()``) reads the backend's."""
        empty: dict[str, Any] = {"enqueued_at": None, "started_at": None, "finished_at": None}
        return TaskResult(
            task=self.task, id=job_id, status=TaskResultStatus.READY, last_attempted_at=None, args=[],
            kwargs={}, backend=self.task.backend, errors=[], worker_ids=[], **empty,
        )  # fmt: skip

    def remove(self, job_id: str) -> None:
        """Delete task result ``job_id`` while it is READY (policy "replace"; django-tasks-db's backend:
        see :meth:`UniqueBackend.refusal`). A worker that claimed it meanwhile is refused its start."""
        from django_tasks_db.models import DBTaskResult  # type: ignore[import-untyped, unused-ignore]

        DBTaskResult.objects.filter(id=job_id, status=TaskResultStatus.READY).delete()

    def push_later(
        self, job_cls: type[UniqueJob], args: tuple[Any, ...], kwargs: dict[str, Any], delay: float
    ) -> TaskResult:
        """Enqueue the task to run in ``delay`` seconds as a new try of ``enqueue`` (its ticket: AGAIN)."""
        task = self._pending()
        later = task.using(run_after=timezone.now() + timedelta(seconds=delay))
        return _backend(task).enqueue_wrapped(later, args, {**kwargs, TICKET: AGAIN})

    def job_gone(self, job_id: str) -> bool:
        """True if the backend no longer has the task result ``job_id``, or has it finished."""
        backend = self.task.get_backend()
        if not backend.supports_get_result:
            return False
        try:
            return bool(backend.get_result(job_id).is_finished)
        except TaskResultDoesNotExist:
            return True  # deleted (pruned, by hand) or expired
        except Exception:  # when in doubt, never delete
            log.warning("cannot tell whether task %s is gone; keeping its lock", job_id, exc_info=True)
            return False


@runtime_checkable
class Wrapping(Protocol):
    """A backend that enqueues on the one it wraps without a lock: a UniqueBackend."""

    def enqueue_wrapped(self, task: Task, args: Any, kwargs: Any) -> TaskResult: ...


def _backend(task: UniqueTask) -> Wrapping:
    backend = task.get_backend()
    if not isinstance(backend, Wrapping):
        raise ConfigurationError(f"task {task.module_path}: its backend {backend!r} is not a UniqueBackend")
    return backend
