"""keep_last and replace with real ``rq worker`` processes (slow tier): docs/strategies.md."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from rq.job import Job, JobStatus

import uniqjob
from tests.integration_workers import (
    NODE_VAR,
    REPO,
    URL_VAR,
    Workers,
    count,
    open_gate,
    wait_until,
    worker_pool,
)
from tests.rq_jobs import QUEUE, Bounded, Busy, Debounced, Latest, Replaced, queue
from uniqjob import Pending, UniqueJob
from uniqjob.integrations.rq import RQQueue
from uniqjob.locks import LockState

pytestmark = pytest.mark.slow


@pytest.fixture
def workers(
    redis_server: object, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Workers]:
    url: str = redis_server.url  # type: ignore[attr-defined]
    monkeypatch.setenv(URL_VAR, url)
    uniqjob.configure(url)
    with worker_pool(url, tmp_path) as pool:
        yield pool


def start_worker(workers: Workers, name: str = "rq", *options: str, **env: str) -> None:
    rq = str(Path(sys.executable).with_name("rq"))
    argv = [rq, "worker", "-u", os.environ[URL_VAR], "-n", f"{name}-{os.urandom(4).hex()}", *options, QUEUE]
    workers.start(name, argv, **env)


def state(job_cls: type[UniqueJob], name: str) -> LockState:
    return uniqjob.default_backend().read(job_cls.lock_key(name, 0))


def versions(r: redis.Redis, name: str) -> list[int]:
    return [int(v) for v in r.lrange(f"versions:{name}", 0, -1)]


def test_50_triggers_while_running_make_one_more_run_with_the_last(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers)
    first = Latest.enqueue("a", 0)
    assert isinstance(first, Job)
    wait_until(lambda: count(redis_client, "started", "a") == 1, "the first run to start")
    triggers = [Latest.enqueue("a", v) for v in range(1, 51)]
    assert all(isinstance(t, Pending) for t in triggers)
    running = state(Latest, "a")
    assert running.queue is not None and running.queue.pending is not None
    assert running.queue.pending.meta.args == "'a', 50"
    open_gate(redis_client, "a")  # stays open: the next run passes too
    wait_until(lambda: count(redis_client, "done", "a") == 2, "the pending run")
    wait_until(lambda: state(Latest, "a").free, "the lock to go")
    assert versions(redis_client, "a") == [0, 50]
    assert uniqjob.default_backend().drops()["coalesced"] == {"tests.rq_jobs.Latest": 50}


def test_triggers_while_queued_run_the_queued_job_with_the_last_arguments(
    workers: Workers, redis_client: redis.Redis
) -> None:
    first = Latest.enqueue("q", 0)
    assert isinstance(first, Job)
    handles = [Latest.enqueue("q", v) for v in range(1, 11)]
    assert {h.id for h in handles} == {first.id}  # each returns the queued job's handle
    assert len(queue.queue) == 1
    open_gate(redis_client, "q")
    start_worker(workers)
    wait_until(lambda: count(redis_client, "done", "q") == 1 and state(Latest, "q").free, "the run")
    assert versions(redis_client, "q") == [10]
    wait_until(lambda: first.get_status() == JobStatus.FINISHED, "RQ to record it")
    assert first.return_value() == 10


def test_replace_never_runs_the_replaced_job(
    workers: Workers, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = Replaced.enqueue("r", 0)
    new = Replaced.enqueue("r", 1)
    assert isinstance(old, Job) and isinstance(new, Job) and old.id != new.id
    assert old.get_status() == JobStatus.CANCELED and queue.queue.job_ids == [new.id]
    # The queue's removal failing (or a worker holding the job already): the store refuses its start.
    monkeypatch.setattr(RQQueue, "remove", lambda self, job_id: None)
    kept = Replaced.enqueue("r", 2)
    newest = Replaced.enqueue("r", 3)
    assert queue.queue.job_ids == [new.id, kept.id, newest.id]
    open_gate(redis_client, "r")
    start_worker(workers)
    wait_until(lambda: not queue.queue.job_ids and state(Replaced, "r").free, "the queue to drain")
    wait_until(lambda: newest.get_status() == JobStatus.FINISHED, "RQ to record it")
    assert versions(redis_client, "r") == [3]


def test_a_pending_call_behind_a_killed_worker_runs_after_the_reap(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers, "doomed", **{NODE_VAR: "elsewhere"})  # only its lease can tell it died
    Latest.enqueue("k", 0)
    wait_until(lambda: count(redis_client, "started", "k") == 1, "the first run to start")
    assert isinstance(Latest.enqueue("k", 1), Pending)
    workers.kill("doomed")
    wait_until(lambda: state(Latest, "k").run is None, "the dead run's lease to lapse")
    reaped = uniqjob.ops.reap()
    assert [row.key for row in reaped.reclaimed] == [Latest.lock_key("k", 0)]
    queued = state(Latest, "k").queue
    assert queued is not None and queued.state == "queued" and queued.meta.args == "'k', 1"
    open_gate(redis_client, "k")
    start_worker(workers)
    wait_until(lambda: count(redis_client, "done", "k") == 1 and state(Latest, "k").free, "the pending run")
    assert versions(redis_client, "k") == [0, 1]


def test_triggers_from_8_processes_never_overlap_and_never_lose_the_last(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers, "w1")
    start_worker(workers, "w2")
    env = {**os.environ, **workers.env}
    code = "import sys; from tests.rq_jobs import trigger; trigger('race', int(sys.argv[1]), 25)"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(p * 1000)], cwd=REPO, env=env) for p in range(8)
    ]
    assert [p.wait(60) for p in procs] == [0] * 8
    wait_until(lambda: state(Busy, "race").free, "the last run to end", timeout=30)
    runs = versions(redis_client, "race")
    assert int(redis_client.get("overlaps:race") or 0) == 0  # never two runs at once
    # the last run has the last trigger's arguments: the last call of one of the 8 processes
    assert runs[-1] in {p * 1000 + 24 for p in range(8)}, runs


def settled(job_cls: type[UniqueJob], name: str) -> bool:
    """The key is free and RQ holds no job, queued or scheduled: no run of it can come any more."""
    rq = queue.queue
    return state(job_cls, name).free and len(rq) == 0 and rq.scheduled_job_registry.count == 0


def test_50_triggers_in_a_debounced_burst_run_once_with_the_last(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers, "rq", "--with-scheduler")
    handles = [Debounced.enqueue("d", v) for v in range(1, 51)]
    assert isinstance(handles[0], Job) and {h.id for h in handles} == {handles[0].id}
    assert len(queue.queue) == 0  # scheduled, not queued
    queued = state(Debounced, "d").queue
    assert queued is not None and queued.due is not None and queued.meta.args == "'d', 50"
    wait_until(lambda: count(redis_client, "done", "d") == 1, "the debounced run")
    wait_until(lambda: settled(Debounced, "d"), "nothing left to run")
    assert versions(redis_client, "d") == [50]


def test_max_wait_bounds_a_burst_that_never_ends(workers: Workers, redis_client: redis.Redis) -> None:
    start_worker(workers, "rq", "--with-scheduler")
    version = 0

    def trigger() -> bool:  # a call of the burst every 20 ms (wait_until polls), until a run starts
        nonlocal version
        version += 1
        Bounded.enqueue("b", version)
        return count(redis_client, "started", "b") > 0

    wait_until(trigger, "a run within the burst (max_wait)", timeout=30)
    assert versions(redis_client, "b")[0] < version  # it ran while calls still came
    last = version
    wait_until(lambda: settled(Bounded, "b"), "the burst's last call to run")
    assert versions(redis_client, "b")[-1] == last  # never a lost last trigger
    assert count(redis_client, "done", "b") <= 3
