"""uniqjob.integrations.django with real workers: django-tasks-db's ``db_worker``, django-rq's ``rqworker``.

Django runs in subprocesses only (its settings are once per process, and other tests
configure their own): a driver (``python -c``, set up on tests/dj_settings.py) enqueues
and looks, while a worker runs the tasks of tests/dj_tasks.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration_workers import Workers, wait_until
from tests.redis_server import RedisServer

if importlib.util.find_spec("django_tasks_db") is None:
    pytest.skip("django-tasks-db is not installed: pip install -e '.[test]'", allow_module_level=True)

REPO = Path(__file__).resolve().parent.parent

_PRELUDE = """
import json, os, time
import django
import uniqjob.ops
django.setup()
from django.core.management import call_command
from tests.dj_tasks import MARKS, attempt, counted, fail, flaky, hold
from tests.integration_workers import wait_until
from uniqjob.integrations.django import TaskQueue, task_backends
"""


class Project:
    """The tests' Django project on one SQLite file and one lock store: drive it, start its workers."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory = directory
        self.env = env
        self.workers = Workers(directory, env)

    def run(self, code: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``code`` in a Python set up on the project; its output (a failure shows it)."""
        argv = [sys.executable, "-c", _PRELUDE + textwrap.dedent(code)]
        done = subprocess.run(
            argv,
            cwd=REPO,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def manage(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "django", *args]
        return subprocess.run(
            argv,
            cwd=REPO,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def db_worker(self, name: str = "db_worker") -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "django", "db_worker", "--interval", "0.05", "--no-startup-delay"]
        return self.workers.start(name, [*argv, "--no-reload"])

    def marked(self, name: str) -> bool:
        return (self.directory / name).exists()

    def marked_lines(self, name: str) -> list[str]:
        return (self.directory / name).read_text().splitlines()


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database with django-tasks-db's tables, made once; each test gets a copy."""
    db = tmp_path_factory.mktemp("django") / "template.sqlite3"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.dj_settings", "UNIQJOB_DJ_DB": str(db)}
    argv = [sys.executable, "-m", "django", "migrate", "-v0"]
    subprocess.run(argv, cwd=REPO, env=env, check=True, timeout=120)
    return db


def _project(tmp_path: Path, migrated: Path, redis_url: str, backend: str) -> Iterator[Project]:
    shutil.copy(migrated, tmp_path / "db.sqlite3")
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.dj_settings",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "UNIQJOB_DJ_BACKEND": backend,
        "UNIQJOB_DJ_DB": str(tmp_path / "db.sqlite3"),
        "UNIQJOB_DJ_DIR": str(tmp_path),
        "UNIQJOB_DJ_STORE": redis_url,
        "UNIQJOB_DJ_REDIS": redis_url,
    }
    project = Project(tmp_path, env)
    try:
        yield project
    finally:
        project.workers.close()


@pytest.fixture
def project(
    tmp_path: Path, migrated: Path, redis_server: RedisServer, redis_client: object
) -> Iterator[Project]:
    """The project on django-tasks-db, its locks in the session's Redis."""
    yield from _project(tmp_path, migrated, redis_server.url, "db")


@pytest.fixture
def rq_project(
    tmp_path: Path, migrated: Path, redis_server: RedisServer, redis_client: object
) -> Iterator[Project]:
    """The project on django-tasks-rq (its RQ queue and the locks in the session's Redis)."""
    if importlib.util.find_spec("django_tasks_rq") is None:  # (importing it needs Django's settings)
        pytest.skip("django-tasks-rq is not installed: pip install -e '.[test]'")
    yield from _project(tmp_path, migrated, redis_server.url, "rq")


def test_a_duplicate_is_dropped_while_queued_and_while_running_and_the_lock_goes_with_the_task(
    project: Project,
) -> None:
    queued = project.run(
        """
        first = hold.enqueue("a")
        doomed = fail.enqueue("x")
        try:
            fail.enqueue("x")
        except Exception as exc:
            raised = type(exc).__name__
        call_command("uniqjob_locks", "--json")
        print(json.dumps({"first": str(first.id), "duplicate": hold.enqueue("a"), "raised": raised}))
        """
    )
    *locks, seen = queued.stdout.splitlines()
    first = json.loads(seen)
    assert first["duplicate"] is None and first["raised"] == "JobNotUnique"
    rows = {row["args"]: row for row in map(json.loads, locks)}
    assert rows["'a'"]["state"] == "queued" and rows["'x'"]["state"] == "queued"
    assert rows["'a'"]["job_id"] == first["first"]  # the result id, recorded by the claim

    project.db_worker()
    wait_until(lambda: project.marked("a.started"), "task a to start")
    running = project.run(
        f"""
        call_command("uniqjob_locks", "--class", "tests.dj_tasks.hold")
        duplicate = hold.enqueue("a")
        (MARKS / "a.go").touch()
        (MARKS / "b.go").touch()
        done = lambda: hold.get_result({first["first"]!r}).status == "SUCCESSFUL"
        wait_until(done, "task a to finish")
        wait_until(lambda: not fail.unique_job.is_locked("x"), "the failed task's lock to go")
        again = hold.enqueue("a").id
        print(json.dumps({{"duplicate": duplicate, "again": again}}))
        """
    )
    table, seen = running.stdout.rsplit("\n", 2)[0], running.stdout.splitlines()[-1]
    assert "running" in table and "hold('a')" in table
    second = json.loads(seen)
    assert second["duplicate"] is None and second["again"] != first["first"]
    dropped = subprocess.run(
        [sys.executable, "-m", "uniqjob", "stats", "--url", project.env["UNIQJOB_DJ_STORE"]],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "tests.dj_tasks.hold" in dropped.stdout, dropped.stdout


def test_a_task_that_raises_retry_keeps_its_lock_until_its_next_run_ends(project: Project) -> None:
    first = project.run('print(flaky.enqueue("r").id)').stdout.splitlines()[-1]
    project.db_worker()
    between = project.run(
        f"""
        from django.utils import timezone
        from django_tasks_db.models import DBTaskResult
        wait_until(lambda: flaky.get_result({first!r}).status == "FAILED", "the first run to end")
        (retry,) = DBTaskResult.objects.exclude(id={first!r})  # the next run, an hour from now
        duplicate = flaky.enqueue("r")  # while the retry waits: a duplicate
        locks = list(uniqjob.ops.iter_rows(flaky.unique_job.backend()))
        DBTaskResult.objects.filter(id=retry.id).update(run_after=timezone.now())  # its hour is up
        wait_until(lambda: flaky.get_result(str(retry.id)).status == "SUCCESSFUL", "the retry to run")
        wait_until(lambda: not flaky.unique_job.is_locked("r"), "the lock to go")
        print(json.dumps({{
            "error": flaky.get_result({first!r}).errors[0].exception_class_path,
            "duplicate": duplicate,
            "locks": [(row.state, row.job_id) for row in locks],
            "retry": str(retry.id),
            "ticket": retry.args_kwargs["kwargs"]["_uniqjob"] == DBTaskResult.objects.get(id={first!r})
            .args_kwargs["kwargs"]["_uniqjob"],
        }}))
        """
    )
    seen = json.loads(between.stdout.splitlines()[-1])
    assert seen["error"] == "uniqjob.integrations.django.Retry" and seen["duplicate"] is None
    assert seen["locks"] == [["queued", seen["retry"]]] and seen["ticket"]  # the same lock, same token


def test_a_lock_whose_task_was_deleted_is_freed_by_the_next_enqueue(project: Project) -> None:
    done = project.run(
        """
        from django_tasks_db.models import DBTaskResult
        TaskQueue.suspect_after = 0.0  # (by default a lock is 60 s old before its task is asked about)
        first = hold.enqueue("a")
        DBTaskResult.objects.filter(id=first.id).delete()  # by hand, or pruned: it will never run
        again = hold.enqueue("a")
        print(json.dumps({"first": str(first.id), "again": None if again is None else str(again.id)}))
        """
    )
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["again"] is not None and seen["again"] != seen["first"]


def test_the_system_checks_name_each_misconfigured_backend(project: Project) -> None:
    project.env["UNIQJOB_DJ_MISTAKES"] = "1"
    done = project.manage("check")
    assert done.returncode == 1, done.stdout + done.stderr
    errors = done.stderr
    assert "TASKS['nothing_wrapped']: OPTIONS has no 'backend'" in errors and "(uniqjob.E001)" in errors
    assert "TASKS['not_a_backend']: OPTIONS['backend'] 'os.path' is not a task backend" in errors
    assert "TASKS['bad_policy']" in errors and "'shrug'" in errors
    assert "TASKS['misspelt']" in errors and "unique_lock_autoexpire" in errors  # did you mean
    assert "TASKS['bad_store']" in errors and "s3" in errors
    assert (
        "TASKS['cannot_park']: concurrency_limit parks the calls over the limit, pushed later by the worker"
        " that frees a slot"
        in errors
        and "UniqueImmediateBackend does not" in errors
    )
    assert errors.count("(uniqjob.E002)") == 4 and "TASKS['default']" not in errors
    # and a task of a misconfigured backend is refused at enqueue, naming the problem
    refused = project.run(
        """
        from uniqjob.integrations.django import task_backends
        print(task_backends["nothing_wrapped"].enqueue(hold, ("a",), {}))
        """,
        check=False,
    )
    assert "ImproperlyConfigured: TASKS['nothing_wrapped']: OPTIONS has no 'backend'" in refused.stderr


def test_a_rescheduled_duplicate_is_enqueued_again_once_the_lock_is_free(project: Project) -> None:
    project.run('print(counted.enqueue("c").id, counted.enqueue("c"))')  # the second: rescheduled
    project.db_worker()
    wait_until(lambda: project.marked("c.started"), "the first run")
    (project.directory / "c.go").touch()  # the rescheduled call finds the lock free on one of its tries
    wait_until(
        lambda: project.marked("c.runs") and len(project.marked_lines("c.runs")) == 2, "the second run"
    )
    immediate = project.run(
        """
        from uniqjob.errors import ConfigurationError
        (MARKS / "now.go").touch()
        result = task_backends["immediate"].enqueue(hold.using(backend="immediate"), ("now",), {})
        try:
            counted.using(backend="immediate")
        except ConfigurationError as exc:
            refused = str(exc)
        locked = hold.unique_job.is_locked("now")
        context = task_backends["immediate"].enqueue(attempt.using(backend="immediate"), ("n",), {})
        print(json.dumps({
            "status": result.status, "locked": locked, "refused": refused,
            "attempt": context.return_value,
            "key": attempt.unique_job.lock_key("n") == attempt.unique_job.lock_key(name="n"),
        }))
        """
    )
    seen = json.loads(immediate.stdout.splitlines()[-1])
    assert seen["status"] == "SUCCESSFUL" and not seen["locked"]
    assert seen["attempt"] == 1 and seen["key"]  # a task that takes Django's context: keyed without it
    assert "unique_on_conflict 'reschedule' needs a backend that defers tasks" in seen["refused"]


@pytest.mark.slow
def test_a_concurrency_limit_of_1_parks_the_calls_over_it_and_two_workers_run_them_one_at_a_time_in_order(
    project: Project,
) -> None:
    enqueued = project.run(
        """
        from tests.dj_policies import serial
        print(json.dumps([type(serial.enqueue("order-7", step)).__name__ for step in range(3)]))
        """
    )
    assert json.loads(enqueued.stdout.splitlines()[-1]) == ["TaskResult", "Parked", "Parked"]
    project.db_worker()
    project.db_worker("db_worker_2")
    steps = project.directory / "order-7.steps"
    wait_until(lambda: steps.exists() and steps.read_text().count("end") == 3, "the three steps to end")
    lines = steps.read_text().split("\n")
    assert [line.split()[:2] for line in lines if line] == [
        ["start", "0"], ["end", "0"], ["start", "1"], ["end", "1"], ["start", "2"], ["end", "2"],
    ]  # fmt: skip
    after = project.run(
        """
        from tests.dj_policies import serial
        store = uniqjob.config.resolve(serial.unique_job.unique_backend)
        report = uniqjob.ops.concurrency(store)
        locked = [serial.unique_job.is_locked("order-7", step) for step in range(3)]
        print(json.dumps([report.totals.slots_held, report.totals.parked, locked]))
        """
    )
    assert json.loads(after.stdout.splitlines()[-1]) == [0, 0, [False, False, False]]  # nothing left held


@pytest.mark.slow
def test_a_killed_workers_lock_is_reclaimed_at_the_next_enqueue(project: Project) -> None:
    first = project.run('print(hold.enqueue("a").id)').stdout.splitlines()[-1]
    project.db_worker()
    wait_until(lambda: project.marked("a.started"), "task a to start")
    project.workers.kill("db_worker")  # SIGKILL mid-task: its row stays RUNNING, its lock's holder is dead
    (project.directory / "a.go").touch()
    again = project.run(
        f"""
        print(hold.get_result({first!r}).status)
        print(hold.enqueue("a").id)
        """
    ).stdout.splitlines()
    assert again[-2] == "RUNNING" and again[-1] != first
    project.db_worker("db_worker_2")
    project.run(f'wait_until(lambda: hold.get_result({again[-1]!r}).status == "SUCCESSFUL", "the new task")')


@pytest.mark.slow
def test_on_rq_a_duplicate_is_dropped_while_queued_and_running_and_a_deleted_job_frees_its_lock(
    rq_project: Project,
) -> None:
    project = rq_project
    queued = project.run(
        """
        first, deleted = hold.enqueue("a"), hold.enqueue("gone")
        print(json.dumps({"first": first.id, "deleted": deleted.id, "duplicate": hold.enqueue("a")}))
        """
    )
    first = json.loads(queued.stdout.splitlines()[-1])
    assert first["duplicate"] is None
    freed = project.run(
        f"""
        import django_rq
        TaskQueue.suspect_after = 0.0
        django_rq.get_queue("default").fetch_job({first["deleted"]!r}).delete()
        print(hold.enqueue("gone") is not None)
        """
    )
    assert freed.stdout.splitlines()[-1] == "True"
    argv = [sys.executable, "-m", "django", "rqworker", "--job-class", "django_tasks_rq.Job", "default"]
    project.workers.start("rqworker", argv)
    wait_until(lambda: project.marked("a.started"), "task a to start")
    running = project.run(
        f"""
        duplicate = hold.enqueue("a")
        for name in ("a", "gone"):
            (MARKS / f"{{name}}.go").touch()
        wait_until(lambda: hold.get_result({first["first"]!r}).status == "SUCCESSFUL", "task a to finish")
        print(json.dumps({{"duplicate": duplicate, "again": hold.enqueue("a") is not None}}))
        """
    )
    assert json.loads(running.stdout.splitlines()[-1]) == {"duplicate": None, "again": True}


def test_the_benchmark_counts_one_round_trip_over_the_backends_and_one_for_a_duplicate() -> None:
    """``python -m benchmarks --only django``'s round trips, counted by the servers (never its times)."""
    if importlib.util.find_spec("django_tasks_rq") is None:
        pytest.skip("django-tasks-rq is not installed: pip install -e '.[test]'")
    argv = [sys.executable, "-m", "benchmarks", "--only", "django", "--json"]
    argv += ["--iterations", "3", "--warmup", "1", "--counted", "3"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    trips = {row["id"]: row["extra"]["round trips to the locks"] for row in report["rows"]}
    assert trips == {
        **{f"django.{backend}.plain": 0 for backend in ("db", "rq")},
        "django.db.unique": 1,  # the claim, which records the result id chosen before it
        "django.rq.unique": 2,  # the claim, and the id RQ chose, recorded after
        **{f"django.{backend}.duplicate": 1 for backend in ("db", "rq")},
    }
    assert all(target["met"] for target in report["targets"]), report["targets"]
    queue = {row["id"]: row["extra"]["to the queue"] for row in report["rows"]}
    assert queue["django.rq.duplicate"] == 0 and queue["django.db.plain"] == 0


# -- the conflict policies on django-tasks-db: use_existing, keep_last, replace, debounce -----------

_POLICIES = "from tests.dj_policies import debounced, existing, latest, replaced"


@pytest.mark.slow
def test_keep_last_runs_the_queued_task_with_the_last_call_and_50_calls_while_running_once_more(
    project: Project,
) -> None:
    queued = project.run(
        """
        from tests.dj_policies import debounced, existing, latest, replaced
        from tests.dj_policies import attempted
        first = latest.enqueue("q", 0)
        again = {str(latest.enqueue("q", v).id) for v in range(1, 11)}
        context = attempted.enqueue("c", 0)
        attempted.enqueue("c", 1)
        print(json.dumps({"first": str(first.id), "again": sorted(again), "context": str(context.id)}))
        """
    )
    seen = json.loads(queued.stdout.splitlines()[-1])
    assert seen["again"] == [seen["first"]]  # each duplicate: the queued task's result
    (project.directory / "q.go").touch()
    project.db_worker()
    running = project.run(
        f"""
        from tests.dj_policies import debounced, existing, latest, replaced
        from uniqjob import Pending
        wait_until(lambda: latest.get_result({seen["first"]!r}).status == "SUCCESSFUL", "the queued run")
        latest.enqueue("a", 0)
        wait_until(lambda: (MARKS / "a.started").exists(), "the first run to start")
        pending = [latest.enqueue("a", v) for v in range(1, 51)]
        (MARKS / "a.go").touch()
        wait_until(lambda: len((MARKS / "a.versions").read_text().split()) == 2, "the pending run")
        wait_until(lambda: not latest.unique_job.is_locked("a", 0), "the lock to go")
        from tests.dj_policies import attempted
        wait_until(lambda: attempted.get_result({seen["context"]!r}).is_finished, "the context task")
        print(json.dumps({{
            "pending": all(isinstance(p, Pending) for p in pending),
            "ran": latest.get_result({seen["first"]!r}).return_value,
            "context": attempted.get_result({seen["context"]!r}).return_value,
        }}))
        """
    )
    assert json.loads(running.stdout.splitlines()[-1]) == {"pending": True, "ran": 10, "context": 1}
    assert project.marked_lines("c.versions") == ["1"]  # its context first, then the last call's arguments
    assert project.marked_lines("q.versions") == ["10"]
    assert project.marked_lines("a.versions") == ["0", "50"]


@pytest.mark.slow
def test_replace_deletes_the_queued_task_which_never_runs(project: Project) -> None:
    swapped = project.run(
        """
        from tests.dj_policies import debounced, existing, latest, replaced
        from django_tasks_db.models import DBTaskResult
        old, new = replaced.enqueue("r", 0), replaced.enqueue("r", 1)
        print(json.dumps({"new": str(new.id), "left": [str(r.id) for r in DBTaskResult.objects.all()]}))
        """
    )
    seen = json.loads(swapped.stdout.splitlines()[-1])
    assert seen["left"] == [seen["new"]]  # the replaced task is out of the queue
    (project.directory / "r.go").touch()
    project.db_worker()
    project.run(
        f"""
        from tests.dj_policies import debounced, existing, latest, replaced
        wait_until(lambda: replaced.get_result({seen["new"]!r}).status == "SUCCESSFUL", "the new task")
        wait_until(lambda: not replaced.unique_job.is_locked("r", 0), "the lock to go")
        """
    )
    assert project.marked_lines("r.versions") == ["1"]


@pytest.mark.slow
def test_50_calls_in_a_debounced_burst_run_once_with_the_last(project: Project) -> None:
    project.db_worker()
    burst = project.run(
        """
        from tests.dj_policies import debounced, existing, latest, replaced
        ids = {str(debounced.enqueue("d", v).id) for v in range(1, 51)}
        wait_until(lambda: (MARKS / "d.versions").exists(), "the debounced run")
        wait_until(lambda: not debounced.unique_job.is_locked("d", 0), "the lock to go")
        print(len(ids))
        """
    )
    assert burst.stdout.splitlines()[-1] == "1"
    assert project.marked_lines("d.versions") == ["50"]


@pytest.mark.slow
def test_use_existing_results_resolve_to_the_first_tasks(project: Project) -> None:
    first = project.run(f'{_POLICIES}; print(existing.enqueue("u").id, existing.enqueue("u").id)')
    ids = first.stdout.split()[-2:]
    assert ids[0] == ids[1]  # while queued
    project.db_worker()
    waited = project.run(
        """
        from tests.dj_policies import debounced, existing, latest, replaced
        wait_until(lambda: (MARKS / "u.started").exists(), "the task to start")
        running = existing.enqueue("u")  # while running: its status is the backend's once refreshed
        (MARKS / "u.go").touch()
        def done() -> bool:
            running.refresh()
            return running.is_finished
        wait_until(done, "the first task's result")
        print(running.id, running.return_value)
        """
    )
    assert waited.stdout.split()[-2:] == [ids[0], "u"]


def test_the_policies_a_backend_cannot_give_are_refused_naming_why(project: Project) -> None:
    refused = project.run(
        """
        from tests.dj_policies import debounced, existing, latest, replaced, serial
        from uniqjob.errors import ConfigurationError
        for made in (latest, replaced, debounced, existing, serial):
            try:
                made.using(backend="immediate")
            except ConfigurationError as exc:
                print(exc)
        """
    )
    lines = refused.stdout.splitlines()[-5:]
    ids = "needs a backend that gives a task result the id chosen before it is enqueued"
    assert lines[0].startswith("task tests.dj_policies.latest: unique_on_conflict 'keep_last' " + ids)
    assert lines[1].startswith("task tests.dj_policies.replaced: unique_on_conflict 'replace' " + ids)
    assert lines[2].startswith("task tests.dj_policies.debounced: unique_debounce " + ids)
    assert lines[3] == (
        "task tests.dj_policies.existing: unique_on_conflict 'use_existing' gives a duplicate the holder's"
        " TaskResult, which UniqueImmediateBackend cannot fetch (get_result)"
    )
    assert lines[4].startswith(
        "task tests.dj_policies.serial: concurrency_limit parks the calls over the limit"
    )
    assert lines[4].endswith("UniqueImmediateBackend does not")
