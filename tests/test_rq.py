"""The RQ integration against real ``rq worker`` processes and the session's private redis-server."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from rq import Queue, Retry
from rq.job import Job, JobStatus

import uniqjob
import uniqjob.queues
from tests.conftest import FakeClock
from tests.integration_workers import (
    NODE_VAR,
    URL_VAR,
    Workers,
    count,
    open_gate,
    wait_until,
    worker_pool,
)
from tests.redis_server import RedisServer
from tests.rq_jobs import QUEUE, Flaky, Gate, Inline, OneAtATime, Rescheduled, queue
from uniqjob import ConfigurationError, Parked, UniqueJob
from uniqjob.integrations.rq import RQQueue, enqueue_call, retry_delay, run_job
from uniqjob.locks import LockState
from uniqjob.stores.memory import MemoryBackend


@pytest.fixture
def workers(
    redis_server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Workers]:
    monkeypatch.setenv(URL_VAR, redis_server.url)
    uniqjob.configure(redis_server.url)
    with worker_pool(redis_server.url, tmp_path) as pool:
        yield pool


def start_worker(workers: Workers, name: str = "rq", **env: str) -> None:
    """A plain ``rq worker`` on the test queue, with the scheduler (for retry intervals)."""
    rq = str(Path(sys.executable).with_name("rq"))
    url = os.environ[URL_VAR]
    argv = [rq, "worker", "-u", url, "-n", f"{name}-{uuid.uuid4().hex[:8]}", "--with-scheduler", QUEUE]
    workers.start(name, argv, **env)


def state(job_cls: type[UniqueJob], *args: object) -> LockState:
    return uniqjob.default_backend().read(job_cls.lock_key(*args))


def test_duplicates_while_a_job_runs_run_once(workers: Workers, redis_client: redis.Redis) -> None:
    start_worker(workers)
    job = Gate.enqueue("a")
    assert isinstance(job, Job)
    assert job.description == "tests.rq_jobs.Gate('a')"
    wait_until(lambda: count(redis_client, "started", "a") == 1, "the job to start")
    running = state(Gate, "a")
    assert running.queue is not None and running.queue.state == "running"
    assert running.queue.meta.job_id == job.id  # the queue lock records the RQ job id
    assert running.run is not None and running.run.holder.pid != os.getpid()  # held by the work horse

    assert [Gate.enqueue("a") for _ in range(25)] == [None] * 25
    assert Gate.enqueue("b") is not None  # another key is free

    open_gate(redis_client, "a")
    open_gate(redis_client, "b")
    wait_until(lambda: not Gate.is_locked("a") and not Gate.is_locked("b"), "both locks to go")
    assert count(redis_client, "started", "a") == count(redis_client, "done", "a") == 1
    assert len(queue.queue) == 0  # the duplicates never reached RQ
    # the lock goes as perform ends, a moment before RQ records the result
    wait_until(lambda: job.get_status() == JobStatus.FINISHED, "RQ to record the result")
    assert job.return_value() == "a"


def test_killed_worker_is_reclaimed_at_once_on_its_host(workers: Workers, redis_client: redis.Redis) -> None:
    start_worker(workers, "first")
    Gate.enqueue("k")
    wait_until(lambda: count(redis_client, "started", "k") == 1, "the job to start")
    assert Gate.enqueue("k") is None  # a live job is never robbed

    workers.kill("first")  # the worker and its work horse, mid-job
    second = Gate.enqueue("k")  # the horse's pid is gone: provably dead, reclaimed at once
    assert isinstance(second, Job)

    start_worker(workers, "second")
    open_gate(redis_client, "k")
    wait_until(lambda: count(redis_client, "done", "k") == 1, "the new job to run")
    wait_until(lambda: not Gate.is_locked("k"), "its lock to go")
    assert count(redis_client, "started", "k") == 2  # the killed run, then the new one


@pytest.mark.slow
def test_killed_worker_elsewhere_is_reclaimed_within_one_lease(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers, "remote", **{NODE_VAR: "another-machine"})
    Gate.enqueue("r")
    wait_until(lambda: count(redis_client, "started", "r") == 1, "the job to start")
    time.sleep(Gate.unique_run_lease * 1.5)  # alive across leases: its heartbeat keeps the lock
    assert Gate.enqueue("r") is None

    workers.kill("remote")
    killed = time.monotonic()
    assert Gate.enqueue("r") is None  # another machine's pid cannot be checked: wait for the lease
    waited = wait_until(lambda: Gate.enqueue("r") is not None, "the lease to lapse", timeout=10)
    assert waited <= Gate.unique_run_lease + 1.0
    assert time.monotonic() - killed >= Gate.unique_run_lease * 0.5


@pytest.mark.slow
def test_retries_keep_the_lock_until_the_last_attempt(workers: Workers, redis_client: redis.Redis) -> None:
    start_worker(workers)
    job = Flaky.enqueue("f", 1)
    wait_until(lambda: count(redis_client, "started", "f") == 1, "attempt 1")
    first = state(Flaky, "f", 1)
    assert first.queue is not None
    open_gate(redis_client, "f:1")  # attempt 1 fails; RQ retries it a second later

    def waiting_for_retry() -> bool:
        now = state(Flaky, "f", 1)
        return now.queue is not None and now.queue.state == "queued" and now.run is None

    wait_until(waiting_for_retry, "the lock to wait, queued, for the retry")
    between = state(Flaky, "f", 1)
    assert between.queue is not None
    assert between.queue.token == first.queue.token and between.queue.meta.job_id == job.id
    assert Flaky.enqueue("f", 1) is None  # still unique while the retry waits

    wait_until(lambda: count(redis_client, "started", "f") == 2, "attempt 2")
    assert Flaky.enqueue("f", 1) is None
    open_gate(redis_client, "f:2")
    wait_until(lambda: not Flaky.is_locked("f", 1), "the lock to go after the last attempt")
    assert count(redis_client, "done", "f") == 1
    wait_until(lambda: job.get_status() == JobStatus.FINISHED, "RQ to record the result")


@pytest.mark.slow
def test_a_job_that_fails_for_good_releases_its_lock(workers: Workers, redis_client: redis.Redis) -> None:
    start_worker(workers)
    job = Flaky.enqueue("d", 99, False)
    wait_until(lambda: job.get_status() == JobStatus.FAILED, "the job to fail for good")
    assert count(redis_client, "started", "d") == 3  # first try and both retries
    assert not Flaky.is_locked("d", 99, False)
    assert job.id in queue.queue.failed_job_registry.get_job_ids()
    assert Flaky.enqueue("d", 99, False) is not None


@pytest.mark.slow
def test_reschedule_goes_through_rqs_scheduler(workers: Workers, redis_client: redis.Redis) -> None:
    start_worker(workers)
    Rescheduled.enqueue("s")
    wait_until(lambda: count(redis_client, "started", "s") == 1, "the first run")
    assert Rescheduled.enqueue("s") is None  # held: tried again a second later, through RQ
    scheduled = queue.queue.scheduled_job_registry.get_job_ids()
    assert [queue.queue.fetch_job(i).func_name for i in scheduled] == [  # type: ignore[union-attr]
        "uniqjob.integrations.rq.enqueue_again"
    ]
    open_gate(redis_client, "s")
    wait_until(lambda: count(redis_client, "done", "s") == 2, "the rescheduled call to run")
    wait_until(lambda: not Rescheduled.is_locked("s"), "its lock to go")


@pytest.mark.slow
def test_block_parks_and_a_promotion_enqueues_into_rq(workers: Workers, redis_client: redis.Redis) -> None:
    start_worker(workers)
    first = OneAtATime.enqueue("p1")
    assert isinstance(first, Job)
    wait_until(lambda: count(redis_client, "started", "p1") == 1, "the first job to start")
    parked = OneAtATime.enqueue("p2")
    assert parked is not None and not isinstance(parked, Job)  # parked, not in RQ yet
    assert len(queue.queue) == 0 and OneAtATime.is_locked("p2")
    open_gate(redis_client, "p1")
    wait_until(lambda: count(redis_client, "started", "p2") == 1, "the parked job to be enqueued and run")
    assert count(redis_client, "done", "p1") == 1  # only once the first gave up its slot
    open_gate(redis_client, "p2")
    wait_until(lambda: not OneAtATime.is_locked("p2"), "its lock to go")


# -- without a worker: RQ's own records prove a queued job gone ---------------------------


@pytest.fixture
def rq_redis_client(redis_client: redis.Redis) -> redis.Redis:
    """The test Redis, RQ's (whatever the lock store)."""
    return redis_client


@pytest.fixture
def rq_redis(
    redis_server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> redis.Redis:
    monkeypatch.setenv(URL_VAR, redis_server.url)
    uniqjob.configure(redis_server.url)
    return redis_client


def test_a_queued_job_that_still_exists_keeps_its_lock(rq_redis: redis.Redis) -> None:
    job = Gate.enqueue("q")
    assert isinstance(job, Job)
    for _ in range(3):
        assert Gate.enqueue("q") is None
    held = state(Gate, "q")
    assert held.queue is not None and held.queue.state == "queued" and held.queue.meta.job_id == job.id
    assert job.meta["uniqjob"] == {
        "key": Gate.lock_key("q"),
        "token": held.queue.token,
        "job": "tests.rq_jobs:Gate",
    }
    assert queue.job_gone(job.id) is False


@pytest.fixture
def aging(
    redis_server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeClock]:
    """RQ on the test Redis, the locks in memory on a clock the test moves (no sleeping)."""
    monkeypatch.setenv(URL_VAR, redis_server.url)
    clock = FakeClock()
    uniqjob.configure(MemoryBackend(clock=clock))
    monkeypatch.setattr(uniqjob.queues, "_clock", clock)
    yield clock
    uniqjob.configure(None)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The job ids RQQueue.job_gone is asked about, in order."""
    ids: list[str] = []
    job_gone = RQQueue.job_gone

    def spy(self: RQQueue, job_id: str) -> bool:
        ids.append(job_id)
        return job_gone(self, job_id)

    monkeypatch.setattr(RQQueue, "job_gone", spy)
    return ids


@pytest.mark.parametrize("how", ["cancel", "delete", "empty the queue", "expire", "fail", "stop"])
def test_a_job_gone_from_rq_frees_its_lock_at_the_next_enqueue(
    aging: FakeClock, rq_redis_client: redis.Redis, how: str, asked: list[str]
) -> None:
    rq_redis = rq_redis_client
    job = Gate.enqueue("g")
    assert isinstance(job, Job)
    assert state(Gate, "g").queue.meta.job_id == job.id  # type: ignore[union-attr]  # by the claim
    assert Gate.enqueue("g") is None
    assert asked == []  # a young lock's job is not asked about: the duplicate cost one round trip
    if how == "cancel":
        job.cancel()
    elif how == "delete":
        job.delete()
    elif how == "empty the queue":
        queue.queue.empty()  # type: ignore[no-untyped-call, unused-ignore]
    elif how == "expire":
        rq_redis.delete(job.key)  # what a job's ttl does to a job never run
    else:
        job.set_status(JobStatus.FAILED if how == "fail" else JobStatus.STOPPED)
    assert queue.job_gone(job.id)
    asked.clear()
    aging.advance(queue.suspect_after - 1)  # type: ignore[operator]
    assert Gate.enqueue("g") is None  # still young: kept, RQ not asked
    assert asked == []
    aging.advance(1)  # old enough to be suspect: the next enqueue asks RQ, and reclaims it
    again = Gate.enqueue("g")
    assert asked == [job.id]
    assert isinstance(again, Job) and again.id != job.id
    assert state(Gate, "g").queue.meta.job_id == again.id  # type: ignore[union-attr]


def test_a_long_queued_job_is_asked_about_once_per_window_not_at_every_duplicate(
    aging: FakeClock, rq_redis_client: redis.Redis, asked: list[str]
) -> None:
    job = Gate.enqueue("w")
    assert isinstance(job, Job)
    aging.advance(600)  # queued for ten minutes (a busy queue): suspect, yet there
    assert [Gate.enqueue("w") for _ in range(20)] == [None] * 20
    assert asked == [job.id]  # once, not twenty times
    aging.advance(queue.suspect_after - 1)  # type: ignore[operator]
    assert Gate.enqueue("w") is None and asked == [job.id]
    aging.advance(1)
    job.delete()  # lost now: found at the next question, one window later
    again = Gate.enqueue("w")
    assert asked == [job.id, job.id] and isinstance(again, Job)


def test_enqueue_call_job_id_is_recorded_by_the_claim(rq_redis: redis.Redis) -> None:
    job = enqueue_call(Gate, args=("c",), job_id="report-c")
    assert isinstance(job, Job) and job.id == "report-c"
    assert state(Gate, "c").queue.meta.job_id == "report-c"  # type: ignore[union-attr]
    assert enqueue_call(Gate, args=("c",), job_id="report-c2") is None
    assert state(Gate, "c").queue.meta.job_id == "report-c"  # type: ignore[union-attr]


def test_a_job_gone_from_rq_frees_its_concurrency_slot_at_the_next_enqueue(rq_redis: redis.Redis) -> None:
    job = OneAtATime.enqueue("g")
    assert isinstance(job, Job)
    assert isinstance(OneAtATime.enqueue("w"), Parked)
    job.cancel()
    # reclaims the cancelled job's lock and slot; "w", parked first, takes the slot and goes to RQ
    assert isinstance(OneAtATime.enqueue("g"), Parked)
    promoted = state(OneAtATime, "w").queue
    assert promoted is not None and promoted.meta.job_id  # the promoted job's id, for job_gone
    assert queue.queue.job_ids == [promoted.meta.job_id]


def test_sync_queue_runs_the_job_under_its_lock_inline(rq_redis: redis.Redis) -> None:
    job = Inline.enqueue(7)  # RQ's sync mode: run_job runs right here, as a worker would
    assert isinstance(job, Job)
    assert job.return_value() == (True, None)  # locked while it ran; a duplicate from inside was dropped
    assert not Inline.is_locked(7)


# -- bad input -----------------------------------------------------------------------------


def test_bad_queue_settings_are_configuration_errors(rq_redis: redis.Redis) -> None:
    with pytest.raises(ConfigurationError, match="does not take depends_on"):
        RQQueue(Queue("x", connection=rq_redis), depends_on="other")
    with pytest.raises(ConfigurationError, match=r"rq\.Retry"):
        RQQueue(Queue("x", connection=rq_redis), retry=3)
    with pytest.raises(ConfigurationError, match=r"an rq\.Queue or a function"):
        RQQueue("default")  # type: ignore[arg-type]
    lazy = RQQueue(lambda: "not a queue")  # type: ignore[arg-type, return-value]
    with pytest.raises(ConfigurationError, match="factory returned 'not a queue'"):
        _ = lazy.queue


def test_a_job_class_a_worker_cannot_import_is_refused_and_unlocked(rq_redis: redis.Redis) -> None:
    class Local(UniqueJob):
        unique_queue = queue

        def perform(self, n: int) -> None:
            pass

    with pytest.raises(ConfigurationError, match="cannot be imported by a worker"):
        Local.enqueue(1)
    assert not Local.is_locked(1)  # the push failed: its lock went with it
    assert len(queue.queue) == 0


def test_run_job_outside_a_worker_or_without_lock_data_says_so(rq_redis: redis.Redis) -> None:
    with pytest.raises(ConfigurationError, match="runs inside an RQ worker"):
        run_job(1)
    stray = queue.queue.enqueue(run_job, 1)  # enqueued around uniqjob: no lock data in its meta
    with pytest.raises(ConfigurationError, match=f"RQ job {stray.id} carries no uniqjob lock data"):
        stray.perform()


def test_retry_delay_follows_rqs_own_rules(rq_redis: redis.Redis) -> None:
    job = queue.queue.create_job(run_job, retry=Retry(max=2, interval=[5, 7]))
    failed = RuntimeError("boom")
    assert retry_delay(job, failed, None) == 5.0  # the first retry's interval
    job.retries_left = 1
    assert retry_delay(job, failed, None) == 7.0
    job.retries_left = 0
    assert retry_delay(job, failed, None) is None  # failed for good
    assert retry_delay(job, None, "done") is None
    if not hasattr(Retry, "get_interval"):
        return  # RQ 2.0 does not act on a returned Retry: it is just a result
    job.number_of_retries = None
    assert retry_delay(job, None, Retry(max=2, interval=3)) == 3.0  # a returned Retry runs it again
    job.number_of_retries = 2
    assert retry_delay(job, None, Retry(max=2, interval=3)) is None  # ... up to max times
