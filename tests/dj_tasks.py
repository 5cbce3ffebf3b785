"""The tasks of the tests' Django project (tests/dj_settings.py): each leaves marks in ``UNIQJOB_DJ_DIR``."""

import os
import time
from pathlib import Path
from typing import Any

try:
    from django.tasks import task  # type: ignore[import-untyped, unused-ignore]
except ModuleNotFoundError:  # Django 5: the backport
    from django_tasks import task

MARKS = Path(os.environ.get("UNIQJOB_DJ_DIR", "."))


@task  # type: ignore[untyped-decorator, unused-ignore]  # (Django 6's is untyped)
def hold(name: str) -> str:
    """Mark ``NAME.started``, then run until ``NAME.go`` exists (at most 60 s)."""
    (MARKS / f"{name}.started").write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while not (MARKS / f"{name}.go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return name


@task(unique_on_conflict="raise")  # type: ignore[untyped-decorator, unused-ignore]
def fail(name: str) -> None:
    raise RuntimeError(f"{name} failed")


@task  # type: ignore[untyped-decorator, unused-ignore]
def flaky(name: str) -> str:
    """Ask to be run again in an hour on its first run (``NAME.tried``); succeed on the next."""
    from uniqjob.integrations.django import Retry

    tried = MARKS / f"{name}.tried"
    if not tried.exists():
        tried.touch()
        raise Retry(3600)
    return name


@task(unique_on_conflict="reschedule", unique_reschedule_delay=0.2)  # type: ignore[untyped-decorator, unused-ignore]
def counted(name: str) -> str:
    """Add a line to ``NAME.runs`` (its runs, counted), then run as :func:`hold` does."""
    with open(MARKS / f"{name}.runs", "a") as runs:
        runs.write("ran\n")
    return str(hold.call(name))


@task(takes_context=True)  # type: ignore[untyped-decorator, unused-ignore]
def attempt(context: Any, name: str) -> int:
    """Which attempt of the task this is (Django's context: its key is the name's alone)."""
    return int(context.attempt)
