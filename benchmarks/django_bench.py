"""Django's tasks: a unique enqueue's cost over the wrapped backend's own (django-tasks-db, -rq).

As the queues section (:mod:`benchmarks.queues`): the locks on one private
redis-server, RQ's queue on another, round trips counted by each server. The
database backend is SQLite in memory: its enqueue makes no round trip to
either, so its unique enqueue shows the lock store's alone. Django is set up
in this process (``settings.configure``): run it as ``python -m benchmarks
--only django``, in a process of its own.

The targets (issue 25): a unique enqueue = plain + 1 round trip to the lock
store on the database backend, whose result ids uniqjob chooses before the
claim; plain + 2 on django-tasks-rq, which chooses its own (the id is recorded
once known); a duplicate = 1, and nothing of the backend. Times are medians of
the paths called in turn, beside a PING of the lock store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from benchmarks.queues import PATHS, Servers, _timed
from benchmarks.report import Report, Row, Target

__all__ = ["BACKENDS", "django_job", "measure", "run_section"]

#: Each wrapped backend, and the round trips over plain its unique enqueue may cost.
BACKENDS = {"db": ("django_tasks_db.DatabaseBackend", 1), "rq": ("django_tasks_rq.RQBackend", 2)}


def django_job(n: int) -> int:
    """The task of every path (a module-level function, as Django asks)."""
    return n


def _setup(locks_url: str, queue_url: str) -> dict[str, dict[str, Callable[[], object]]]:
    """Configure Django (two aliases per backend: plain and unique); each backend's paths."""
    import itertools

    import django  # type: ignore[import-untyped]
    from django.conf import settings  # type: ignore[import-untyped]
    from django.core.management import call_command  # type: ignore[import-untyped]

    tasks: dict[str, Any] = {}
    for name, (path, _) in BACKENDS.items():
        tasks[f"plain_{name}"] = {"BACKEND": path}
        options = {"backend": path, "unique_backend": locks_url, "unique_lock_autoexpire": 3600}
        tasks[f"unique_{name}"] = {"BACKEND": "uniqjob.integrations.django.UniqueBackend", "OPTIONS": options}
    settings.configure(
        INSTALLED_APPS=[*(["django_tasks"] if django.VERSION < (6,) else []), "django_tasks_db", "django_rq"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        RQ_QUEUES={"default": {"URL": queue_url}},
        TASKS=tasks,
        USE_TZ=True,
    )
    django.setup()
    call_command("migrate", verbosity=0)
    try:
        from django.tasks import task  # type: ignore[import-untyped, unused-ignore]
    except ModuleNotFoundError:  # Django 5: the backport
        from django_tasks import task
    ids = itertools.count()
    ops: dict[str, dict[str, Callable[[], object]]] = {}
    # What a task's path (this function's) names must be a Task: the database backend reads it back.
    function = globals()["django_job"]
    globals()["django_job"] = task(backend="plain_db")(function)
    for name in BACKENDS:
        plain, unique = (task(backend=f"{kind}_{name}")(function) for kind in ("plain", "unique"))
        unique.enqueue(-1)  # the lock stays: every duplicate meets it
        ops[name] = {
            "plain": partial(_enqueue, plain, ids),
            "unique": partial(_enqueue, unique, ids),
            "duplicate": partial(unique.enqueue, -1),
        }
    return ops


def _enqueue(task: Any, ids: Iterator[int]) -> object:
    return task.enqueue(next(ids))


def measure(
    locks_url: str, queue_url: str, *, calls: int = 20, iterations: int = 0, warmup: int = 0
) -> dict[str, dict[str, dict[str, float]]]:
    """``{backend: {path: {"locks", "queue": round trips per call; "median_us", "p99_us", "ping_us"}}}``."""
    servers = Servers(locks_url, queue_url)
    ping = servers.admin["locks"].ping
    try:
        ops = _setup(locks_url, queue_url)
        out: dict[str, dict[str, dict[str, float]]] = {}
        for name, paths in ops.items():
            for op in paths.values():
                op()  # warm: connections made, scripts loaded
            out[name] = {}
            timed = _timed({"ping": ping, **paths}, iterations, warmup) if iterations else {}
            for path, op in paths.items():
                trips = servers.count(calls, op)
                out[name][path] = {"locks": trips.locks, "queue": trips.queue}
                if timed:
                    out[name][path] |= {"median_us": timed[path].median_us, "p99_us": timed[path].p99_us}
                    out[name][path] |= {"ping_us": timed["ping"].median_us}
        return out
    finally:
        servers.close()


def run_section(report: Report, locks_url: str, iterations: int, warmup: int, counted: int) -> None:
    """``python -m benchmarks``'s django section: rows of times and round trips, and the targets."""
    from tests.redis_server import RedisServer

    with RedisServer() as queue_server:
        found = measure(locks_url, queue_server.url, calls=counted, iterations=iterations, warmup=warmup)
    for name, paths in found.items():
        plain = paths["plain"]
        for path in PATHS:
            got = paths[path]
            row = Row(f"django.{name}.{path}", f"django {name}: {path} enqueue")
            row.median_us, row.p99_us = got["median_us"], got["p99_us"]
            row.n = iterations
            row.floor, row.floor_median_us = "PING", got["ping_us"]  # a round trip to the lock store
            row.ratio = got["median_us"] / got["ping_us"]
            row.extra = {"round trips to the locks": got["locks"], "to the queue": got["queue"]}
            report.rows.append(row)
        unique, dup = paths["unique"], paths["duplicate"]
        report.targets += [
            Target(
                f"django.{name}.unique.trips",
                f"django {name}: unique round trips to the locks (queue's: {plain['queue']:g} plain,"
                f" {unique['queue']:g} unique)",
                unique["locks"] - plain["locks"],
                BACKENDS[name][1],
                "",
            ),
            Target(
                f"django.{name}.duplicate.trips",
                f"django {name}: duplicate round trips ({dup['queue']:g} to the queue)",
                dup["locks"] + dup["queue"],
                1,
                "",
            ),
        ]
