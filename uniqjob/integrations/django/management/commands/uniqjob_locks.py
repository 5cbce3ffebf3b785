"""``manage.py uniqjob_locks``: ``uniqjob locks`` on the lock store of a UniqueBackend of TASKS."""

from __future__ import annotations

from argparse import ArgumentParser
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

from django.core.management.base import BaseCommand, CommandError  # type: ignore[import-untyped]

from uniqjob.cli import main
from uniqjob.integrations.django import UniqueBackend, task_backends


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no type information
    help = "List the held locks of the unique tasks of a TASKS backend (uniqjob locks, on its store)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--backend", default="default", help="the TASKS alias (default: %(default)s)")
        parser.add_argument("--json", action="store_true", help="one JSON object per line")
        parser.add_argument("--class", dest="job_class", metavar="NAME", help="only the locks of this task")

    def handle(self, *args: Any, backend: str, json: bool, job_class: str | None, **options: Any) -> None:
        tasks = task_backends[backend]
        if not isinstance(tasks, UniqueBackend):
            raise CommandError(f"TASKS[{backend!r}] is not a uniqjob.integrations.django.UniqueBackend")
        argv = ["locks", *tasks.store_argv()]
        argv += ["--json"] * json + (["--class", job_class] if job_class else [])
        with redirect_stdout(self.stdout), redirect_stderr(self.stderr):
            status = main(argv)
        if status:
            raise CommandError(f"uniqjob locks exited {status}", returncode=status)
