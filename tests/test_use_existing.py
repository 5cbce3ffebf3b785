"""``unique_on_conflict = "use_existing"``: a duplicate gets the holder's queue handle, not None.

In this process with a queue of the test's own (the settings, the refusals, ``run()``),
then with real RQ, Celery and arq workers: the handle resolves to the first job's result.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

import uniqjob
from tests.integration_workers import URL_VAR, Workers, count, open_gate, wait_until, worker_pool
from tests.redis_server import RedisServer
from uniqjob import ConfigurationError, JobLock, Queue, UniqueJob, unique
from uniqjob.stores.memory import MemoryBackend

STORE = MemoryBackend()


class Handle:
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id


class Handles(Queue):
    """A queue that keeps what it is given and names its jobs: enough to make handles."""

    suspect_after = 60.0

    def __init__(self) -> None:
        self.pushed: list[str] = []

    def new_job_id(self) -> str:
        return uuid.uuid4().hex

    def push(
        self, job_cls: type[UniqueJob], lock: JobLock, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        self.pushed.append(lock.meta.job_id)
        return Handle(lock.meta.job_id)

    def handle(self, job_id: str) -> Handle:
        return Handle(job_id)


QUEUE = Handles()


class Plain(UniqueJob):
    unique_backend = STORE
    unique_queue = QUEUE

    def perform(self, n: int) -> int:
        return n


class Report(Plain):
    unique_on_conflict = "use_existing"


def test_a_duplicate_gets_the_holders_handle() -> None:
    first = Report.enqueue(1)
    again = Report.enqueue(1)
    assert isinstance(first, Handle) and isinstance(again, Handle)
    assert again.job_id == first.job_id and QUEUE.pushed.count(first.job_id) == 1
    assert Report.enqueue(2).job_id != first.job_id  # another key: a job of its own
    # per call, on a class that drops duplicates
    assert Plain.enqueue(3) is not None and Plain.enqueue(3) is None
    assert Plain.using(on_conflict="use_existing").enqueue(3).job_id == QUEUE.pushed[-1]


def test_inline_run_of_a_duplicate_is_dropped() -> None:
    held = Report.enqueue(4)
    assert isinstance(held, Handle)
    assert Report.run(4) is None  # run() wants a result now: no handle to wait on, dropped as "log"


def test_decorated_functions_take_it_too() -> None:
    @unique(on_conflict="use_existing", queue=QUEUE, backend=STORE)
    def send(n: int) -> None: ...

    first = send.enqueue(5)
    assert send.enqueue(5).job_id == first.job_id


def test_a_class_whose_queue_cannot_give_a_handle_is_refused() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"Inline\.unique_on_conflict is 'use_existing', but the class has no",
    ):

        class Inline(UniqueJob):
            unique_on_conflict = "use_existing"

            def perform(self) -> None: ...

    class Blind(Queue):
        def push(self, job_cls: type[UniqueJob], lock: JobLock, args: Any, kwargs: Any) -> None: ...

        def __repr__(self) -> str:
            return "Blind()"

    with pytest.raises(ConfigurationError, match=r"Nameless\.unique_on_conflict .* Blind\(\) cannot"):

        class Nameless(UniqueJob):
            unique_queue = Blind()
            unique_on_conflict = "use_existing"

            def perform(self) -> None: ...


# -- real workers --------------------------------------------------------------------------


@pytest.fixture
def workers(
    redis_server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Any:
    monkeypatch.setenv(URL_VAR, redis_server.url)
    uniqjob.configure(redis_server.url)
    with worker_pool(redis_server.url, tmp_path) as pool:
        yield pool


def test_rq_duplicates_wait_for_the_first_jobs_result(workers: Workers, redis_client: redis.Redis) -> None:
    from rq.job import Job

    from tests.rq_jobs import QUEUE as RQ_QUEUE
    from tests.rq_jobs import Gate

    existing = Gate.using(on_conflict="use_existing")
    first = existing.enqueue("u")
    queued = existing.enqueue("u")  # while queued
    rq = str(Path(sys.executable).with_name("rq"))
    workers.start(
        "rq", [rq, "worker", "-u", os.environ[URL_VAR], "-n", f"rq-{uuid.uuid4().hex[:8]}", RQ_QUEUE]
    )
    wait_until(lambda: count(redis_client, "started", "u") == 1, "the job to start")
    running = existing.enqueue("u")  # while running
    assert isinstance(first, Job) and isinstance(queued, Job) and isinstance(running, Job)
    assert queued.id == running.id == first.id
    open_gate(redis_client, "u")
    wait_until(lambda: running.return_value() is not None, "the first job's result")
    assert queued.return_value() == running.return_value() == "u"
    assert count(redis_client, "started", "u") == 1


def test_celery_duplicates_wait_for_the_first_tasks_result(
    workers: Workers, redis_client: redis.Redis
) -> None:
    from celery.backends.redis import RedisBackend as RedisResults
    from celery.result import AsyncResult

    from tests.celery_app import QUEUE as CELERY_QUEUE
    from tests.celery_app import RESULTS_VAR, app, gate

    app.conf.broker_url = os.environ[URL_VAR]
    first = gate.apply_async(("c",))
    argv = [sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker", "-P", "solo"]
    argv += ["-Q", CELERY_QUEUE]
    workers.start("celery", [*argv, "--without-gossip", "--without-mingle"], **{RESULTS_VAR: "1"})
    wait_until(lambda: count(redis_client, "started", "c") == 1, "the task to start", timeout=30)
    again = gate.apply_async(("c",), unique_on_conflict="use_existing")
    assert isinstance(again, AsyncResult) and again.id == first.id
    assert gate.apply_async(("c",)) is None  # the class's own policy: dropped
    open_gate(redis_client, "c")
    # Read through a result backend of its own: the app makes its backend once per thread, and an
    # earlier test of this process may have made it before this one configured a result backend.
    results = RedisResults(app=app, url=os.environ[URL_VAR])
    assert AsyncResult(again.id, backend=results, app=app).get(timeout=20) == "c"


def test_arq_duplicates_wait_for_the_first_jobs_result(workers: Workers, redis_client: redis.Redis) -> None:
    pytest.importorskip("arq", reason="arq is not installed: pip install --no-deps 'arq>=0.28'")
    from arq.jobs import Job

    from tests.arq_jobs import Gate

    existing = Gate.using(on_conflict="use_existing")

    async def enqueue() -> Any:
        return await existing.aenqueue("a")

    first = asyncio.run(enqueue())
    workers.start("arq", [str(Path(sys.executable).with_name("arq")), "tests.arq_jobs.WorkerSettings"])
    wait_until(lambda: count(redis_client, "started", "a") == 1, "the job to start")

    async def duplicate_result() -> Any:
        again = await existing.aenqueue("a")
        assert isinstance(again, Job) and again.job_id == first.job_id
        open_gate(redis_client, "a")
        return await again.result(timeout=20, poll_delay=0.05)

    assert asyncio.run(duplicate_result()) == "a"
