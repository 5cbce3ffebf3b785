"""RQ options for one job (enqueue_call), and what "reschedule" costs RQ, on real ``rq worker`` processes."""

from __future__ import annotations

import time

import pytest
import redis
from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry, ScheduledJobRegistry, StartedJobRegistry

from tests.integration_workers import Workers, count, open_gate, wait_until
from tests.rq_jobs import Gate, Rescheduled, Timed, queue
from tests.test_rq import rq_redis, start_worker, state, workers  # the worker, and the fixtures
from uniqjob import ConfigurationError, UniqueJob
from uniqjob.integrations.rq import enqueue_call

__all__ = ["rq_redis", "workers"]


def test_one_jobs_options_apart_from_its_arguments(workers: Workers, redis_client: redis.Redis) -> None:
    ahead = Gate.enqueue("ahead")
    assert isinstance(ahead, Job)
    job = enqueue_call(Timed, ("t",), {"timeout": 5}, timeout=60, at_front=True, job_id="timed-t")
    assert isinstance(job, Job) and job.id == "timed-t" and job.timeout == 60
    assert queue.queue.job_ids == ["timed-t", ahead.id]  # at_front, for this job only
    held = state(Timed, "t", 5).queue
    assert held is not None and held.meta.job_id == "timed-t"  # the lock records the given id
    assert enqueue_call(Timed, ("t",), {"timeout": 5}, job_id="other") is None  # still a duplicate
    assert queue.queue.fetch_job("other") is None

    start_worker(workers)
    wait_until(lambda: job.get_status() == JobStatus.FINISHED, "the job to run")
    assert job.return_value() == 5  # perform's own timeout argument
    assert not Timed.is_locked("t", 5)
    later = Timed.enqueue("u", 1)  # the class's own options again
    assert isinstance(later, Job) and later.timeout == queue.queue._default_timeout
    open_gate(redis_client, "ahead")


def test_bad_per_call_options_say_which(rq_redis: redis.Redis) -> None:
    with pytest.raises(ConfigurationError, match="enqueue_call does not take depends_on"):
        enqueue_call(Timed, ("x", 1), depends_on="other")
    with pytest.raises(ConfigurationError, match=r"retry must be an rq\.Retry"):
        enqueue_call(Timed, ("x", 1), retry=2)
    with pytest.raises(ConfigurationError, match="job_id must be a non-empty string"):
        enqueue_call(Timed, ("x", 1), job_id="")

    class NoQueue(UniqueJob):
        def perform(self) -> None:
            pass

    with pytest.raises(ConfigurationError, match="unique_queue is None, not an RQQueue"):
        enqueue_call(NoQueue)
    assert not Timed.is_locked("x", 1)


def _helpers(r: redis.Redis) -> list[str]:
    """Every rescheduling helper job RQ holds: queued, scheduled, running or finished."""
    q = queue.queue
    ids = set(q.job_ids)
    for registry in (ScheduledJobRegistry, StartedJobRegistry, FinishedJobRegistry):
        ids |= set(registry(queue=q).get_job_ids())
    jobs = [q.fetch_job(i) for i in ids]
    return sorted(j.id for j in jobs if j is not None and (j.func_name or "").endswith("enqueue_again"))


@pytest.mark.slow
def test_a_rescheduled_duplicate_costs_one_delayed_job_however_long_the_first_runs(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers, "first")
    Rescheduled.enqueue("long")
    wait_until(lambda: count(redis_client, "started", "long") == 1, "the first run")
    start_worker(workers, "second")  # free to run the helpers while the first runs
    assert Rescheduled.enqueue("long") is None  # rescheduled, a second later
    assert Rescheduled.enqueue("long") is None  # and another duplicate
    seen: set[str] = set()
    # the first runs on for 4 s: each duplicate's helper tries every second, as the same job
    deadline = redis_client.time()[0] + 4
    while redis_client.time()[0] < deadline:
        helpers = _helpers(redis_client)
        assert len(helpers) <= 2
        seen |= set(helpers)
        time.sleep(0.05)
    assert len(seen) == 2, seen
    fetched = [queue.queue.fetch_job(i) for i in sorted(seen)]
    tries = [(j.number_of_retries or 0) if j is not None else 0 for j in fetched]
    assert min(tries) >= 1, tries  # each tried again meanwhile, as the same job
    assert count(redis_client, "started", "long") == 1
    open_gate(redis_client, "long")
    # each duplicate gets through once the key is free: one, then (rescheduled once more) the other
    wait_until(lambda: count(redis_client, "done", "long") == 3, "both rescheduled duplicates to run")
    wait_until(lambda: not Rescheduled.is_locked("long"), "its lock to go")
    wait_until(lambda: _helpers(redis_client) == [], "the helpers to be gone (results not kept)")
