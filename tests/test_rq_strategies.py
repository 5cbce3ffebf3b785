"""The README's strategy table, row by row, on real ``rq worker`` processes (until_executed: test_rq.py)."""

from __future__ import annotations

import time

import pytest
import redis
from rq.job import Job, JobStatus

from tests.integration_workers import Workers, count, open_gate, wait_until
from tests.rq_jobs import UntilAndWhileExecuting, UntilExecuting, UntilExpired, WhileExecuting, queue
from tests.test_rq import start_worker, workers  # the worker, and its fixture (re-exported)

__all__ = ["workers"]


def finished(job: Job) -> bool:
    return job.get_status() == JobStatus.FINISHED


def test_until_executing_locks_from_enqueue_until_perform_starts(
    workers: Workers, redis_client: redis.Redis
) -> None:
    first = UntilExecuting.enqueue("x")
    assert isinstance(first, Job)
    assert UntilExecuting.is_locked("x") and UntilExecuting.enqueue("x") is None  # two waiting: refused
    start_worker(workers)
    wait_until(lambda: count(redis_client, "started", "x") == 1, "the first to start")
    assert not UntilExecuting.is_locked("x")  # running holds nothing
    second = UntilExecuting.enqueue("x")  # a new one may queue while one runs
    assert isinstance(second, Job)
    assert UntilExecuting.enqueue("x") is None  # ... but only one
    open_gate(redis_client, "x")
    wait_until(lambda: finished(first) and finished(second), "both to run")
    assert count(redis_client, "done", "x") == 2
    assert not UntilExecuting.is_locked("x")


@pytest.mark.slow
def test_while_executing_queues_duplicates_and_never_runs_two_at_once(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers, "one")
    first = WhileExecuting.enqueue("x")
    assert isinstance(first, Job)
    wait_until(lambda: count(redis_client, "started", "x") == 1, "the first to start")
    start_worker(workers, "two")
    second = WhileExecuting.enqueue("x")  # duplicates may queue
    assert isinstance(second, Job)
    wait_until(lambda: finished(second), "the second worker to take the duplicate")
    assert second.return_value() is None  # refused at execution time: dropped by the policy
    assert count(redis_client, "started", "x") == 1
    open_gate(redis_client, "x")
    wait_until(lambda: finished(first), "the first to finish")
    assert not WhileExecuting.is_locked("x")
    third = WhileExecuting.enqueue("x")  # nothing runs: the next one runs
    assert isinstance(third, Job)
    wait_until(lambda: finished(third), "the next one to run")
    assert count(redis_client, "done", "x") == 2


def test_until_and_while_executing_allows_one_waiting_and_one_running(
    workers: Workers, redis_client: redis.Redis
) -> None:
    first = UntilAndWhileExecuting.enqueue("x")
    assert isinstance(first, Job)
    assert UntilAndWhileExecuting.enqueue("x") is None  # two waiting: refused
    start_worker(workers, "one")
    wait_until(lambda: count(redis_client, "started", "x") == 1, "the first to start")
    second = UntilAndWhileExecuting.enqueue("x")  # one may queue while one runs
    assert isinstance(second, Job)
    assert UntilAndWhileExecuting.enqueue("x") is None  # ... but only one
    start_worker(workers, "two")
    wait_until(lambda: finished(second), "the second worker to take it")
    assert second.return_value() is None  # two running: refused at execution time, dropped
    assert count(redis_client, "started", "x") == 1
    open_gate(redis_client, "x")
    wait_until(lambda: finished(first), "the first to finish")
    wait_until(lambda: not UntilAndWhileExecuting.is_locked("x"), "its locks to go")


@pytest.mark.slow
def test_until_expired_holds_after_the_job_ran_until_autoexpire(
    workers: Workers, redis_client: redis.Redis
) -> None:
    open_gate(redis_client, "x")  # the job ends as soon as it starts
    start_worker(workers)
    job = UntilExpired.enqueue("x")
    enqueued = time.monotonic()
    assert isinstance(job, Job)
    wait_until(lambda: finished(job), "the job to run")
    assert queue.job_gone(job.id)  # RQ has it finished: "gone" proves nothing for this strategy
    while time.monotonic() - enqueued < UntilExpired.unique_lock_autoexpire - 0.5:
        assert UntilExpired.is_locked("x")
        assert UntilExpired.enqueue("x") is None  # is_locked and enqueue agree
        time.sleep(0.1)
    wait_until(lambda: not UntilExpired.is_locked("x"), "the lock to expire", timeout=5)
    assert time.monotonic() - enqueued >= UntilExpired.unique_lock_autoexpire - 0.1
    again = UntilExpired.enqueue("x")
    assert isinstance(again, Job)
    wait_until(lambda: finished(again), "the next period's job to run")
    assert count(redis_client, "done", "x") == 2
