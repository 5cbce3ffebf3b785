"""Tasks of the tests' Django project with the conflict policies and the concurrency limit that need
django-tasks-db (ids chosen before the push, deferral, deletion): imported by the tests on that backend
only."""

import os
import time
from typing import Any

try:
    from django.tasks import task  # type: ignore[import-untyped, unused-ignore]
except ModuleNotFoundError:  # Django 5: the backport
    from django_tasks import task

from tests.dj_tasks import MARKS, hold


def _record(name: str, version: int) -> None:
    with open(MARKS / f"{name}.versions", "a") as versions:
        versions.write(f"{version}\n")


@task(unique_on_conflict="keep_last", unique_args=("name",))  # type: ignore[untyped-decorator, unused-ignore]
def latest(name: str, version: int) -> int:
    """keep_last: add the version to ``NAME.versions``, then run as :func:`hold` does."""
    _record(name, version)
    hold.call(name)
    return version


@task(unique_on_conflict="replace", unique_args=("name",))  # type: ignore[untyped-decorator, unused-ignore]
def replaced(name: str, version: int) -> int:
    """replace: as :func:`latest`; a call while one is queued takes its place."""
    return int(latest.call(name, version))


@task(unique_debounce=1.0, unique_args=("name",))  # type: ignore[untyped-decorator, unused-ignore]
def debounced(name: str, version: int) -> int:
    """Add the version to ``NAME.versions`` a second after the last call of its name."""
    _record(name, version)
    return version


@task(unique_on_conflict="use_existing")  # type: ignore[untyped-decorator, unused-ignore]
def existing(name: str) -> str:
    """use_existing: a duplicate gets the TaskResult of the task already on its way."""
    return str(hold.call(name))


@task(takes_context=True, unique_on_conflict="keep_last", unique_args=("name",))  # type: ignore[untyped-decorator, unused-ignore]
def attempted(context: Any, name: str, version: int) -> int:
    """keep_last with Django's context: it still comes first, whatever arguments the call got."""
    _record(name, version)
    return int(context.attempt)


@task(concurrency_limit=1, concurrency_key=lambda name, step: name)  # type: ignore[untyped-decorator, unused-ignore]
def serial(name: str, step: int) -> int:
    """One at a time per name (a limit of 1): mark ``NAME.steps`` as step ``STEP`` starts and ends."""
    with open(MARKS / f"{name}.steps", "a") as steps:
        steps.write(f"start {step} {os.getpid()}\n")
    time.sleep(0.2)
    with open(MARKS / f"{name}.steps", "a") as steps:
        steps.write(f"end {step}\n")
    return step
