"""The checks of a UniqueBackend's settings: what ``manage.py check`` reports, what a task is refused."""

from __future__ import annotations

from typing import Any

from ... import config
from ...errors import ConfigurationError
from ...job import UniqueJob
from ._base import BaseTaskBackend, checks


def park_refusal(backend: BaseTaskBackend) -> str:
    """Why the wrapped backend cannot give a task a concurrency limit; "" if it can."""
    if getattr(backend, "chooses_ids", False):
        return ""
    return (
        "concurrency_limit parks the calls over the limit, pushed later by the worker that frees a slot:"
        " uniqjob can on a backend whose workers run the tasks and that gives a task result the id"
        " chosen before it is enqueued (id_function, as django-tasks-db's DatabaseBackend does);"
        f" {type(backend).__name__} does not"
    )


def refusal(backend: BaseTaskBackend, job: type[UniqueJob]) -> str:
    """Why the wrapped backend cannot give ``job`` its conflict policy, debounce or concurrency limit;
    "" if it can."""
    if job.concurrency_limit is not None and (refused := park_refusal(backend)):
        return refused
    policy, kind = job.unique_on_conflict, type(backend).__name__
    what = "unique_debounce" if job.unique_debounce is not None else f"unique_on_conflict {policy!r}"
    if policy == "reschedule" and not backend.supports_defer:
        return f"{what} needs a backend that defers tasks (run_after); {kind} does not"
    if policy == "use_existing" and not backend.supports_get_result:
        return f"{what} gives a duplicate the holder's TaskResult, which {kind} cannot fetch (get_result)"
    if job.unique_debounce is None and policy not in ("keep_last", "replace"):
        return ""
    if not getattr(backend, "chooses_ids", False):
        return (
            f"{what} needs a backend that gives a task result the id chosen before it is enqueued"
            f" (id_function, as django-tasks-db's DatabaseBackend does); {kind} chooses its own"
        )
    if job.unique_debounce is not None and not backend.supports_defer:
        return f"{what} defers the task (run_after); {kind} cannot"
    if policy == "replace" and not _deletes_tasks(backend):
        return (
            f"{what} takes the queued task out of its queue: uniqjob can on django-tasks-db's"
            f" DatabaseBackend only; {kind} has no way to cancel a task"
        )
    return ""


def _deletes_tasks(backend: BaseTaskBackend) -> bool:
    """True if ``backend`` is django-tasks-db's, whose READY tasks :meth:`TaskQueue.remove` deletes."""
    try:
        from django_tasks_db import DatabaseBackend  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return False
    return isinstance(backend, DatabaseBackend)


def settings_problems(where: str, settings: dict[str, Any], backend: object) -> list[checks.CheckMessage]:
    """The errors of the ``unique_*`` options, found by making a job class of them (as a task will)."""
    if "unique_queue" in settings:
        message = f"{where}: unique_queue: the queue is the wrapped backend"
        return [checks.Error(message, id="uniqjob.E002", obj=backend)]
    body = {"perform": staticmethod(lambda: None), "__module__": __name__, **settings}
    for name in ("unique_key", "concurrency_key"):
        if settings.get(name) is not None:
            body[name] = staticmethod(settings[name])
    try:
        type("options", (UniqueJob,), body)
        if isinstance(settings.get("unique_backend"), str):
            config.resolve(settings["unique_backend"])
    except ConfigurationError as exc:
        message = str(exc).replace("options.", "OPTIONS ")
        return [checks.Error(f"{where}: {message}", id="uniqjob.E002", obj=backend)]
    return []
