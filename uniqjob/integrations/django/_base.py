"""Django's names the integration uses: from ``django.tasks`` (Django 6+), else the django-tasks backport."""

from __future__ import annotations

try:
    from asgiref.sync import sync_to_async
    from django.core import checks  # type: ignore[import-untyped]
    from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped]
    from django.utils import timezone  # type: ignore[import-untyped]
    from django.utils.module_loading import import_string  # type: ignore[import-untyped]

    try:  # Django 6+
        from django.tasks import task_backends  # type: ignore[import-untyped]
        from django.tasks.backends.base import BaseTaskBackend  # type: ignore[import-untyped]
        from django.tasks.base import Task, TaskResult, TaskResultStatus  # type: ignore[import-untyped]
        from django.tasks.exceptions import TaskResultDoesNotExist  # type: ignore[import-untyped]
    except ModuleNotFoundError:  # Django 5: the django-tasks backport
        from django_tasks import task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskResult, TaskResultStatus
        from django_tasks.exceptions import TaskResultDoesNotExist
except ModuleNotFoundError as exc:  # the optional extra
    raise ModuleNotFoundError(
        f"uniqjob.integrations.django needs Django 6, or Django 4.2+ with django-tasks ({exc.name} is"
        " missing): pip install 'uniqjob[django]'",
        name=exc.name,
    ) from exc

__all__ = [
    "BaseTaskBackend", "ImproperlyConfigured", "Task", "TaskResult", "TaskResultDoesNotExist",
    "TaskResultStatus", "checks", "import_string", "sync_to_async", "task_backends", "timezone",
]  # fmt: skip
