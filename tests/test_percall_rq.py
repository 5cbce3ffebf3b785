"""RQ: ``enqueue_call(..., unique_*=...)`` and ``Job.using(...)`` on real ``rq worker`` processes."""

from __future__ import annotations

import pytest
import redis
from rq.job import Job

from tests.integration_workers import Workers, count, open_gate, wait_until
from tests.rq_jobs import Gate, queue
from tests.test_rq import rq_redis, start_worker, state, workers  # the worker, and the fixtures
from uniqjob import ConfigurationError, JobNotUnique
from uniqjob.integrations.rq import enqueue_call

__all__ = ["rq_redis", "workers"]


def test_enqueue_call_takes_settings_for_its_call(workers: Workers, redis_client: redis.Redis) -> None:
    job = enqueue_call(Gate, ("pc",), unique_lock_autoexpire=60, job_id="pc-1")
    assert isinstance(job, Job) and job.id == "pc-1"
    assert job.description == "tests.rq_jobs.Gate('pc')"  # shown in RQ as the class's own
    held = state(Gate, "pc").queue
    assert held is not None and held.meta.job_id == "pc-1"
    assert held.ttl is not None and 59 < held.ttl <= 60  # this call's autoexpire
    with pytest.raises(JobNotUnique) as raised:
        enqueue_call(Gate, ("pc",), unique_on_conflict="raise")
    assert raised.value.holder["clears_by"] == "autoexpire" and "clears in" in str(raised.value)
    with pytest.raises(JobNotUnique):
        Gate.using(on_conflict="raise").enqueue("pc")
    assert Gate.enqueue("pc") is None and enqueue_call(Gate, ("pc",)) is None  # the class's "log"

    start_worker(workers)
    wait_until(lambda: count(redis_client, "started", "pc") == 1, "the job to start")
    open_gate(redis_client, "pc")
    wait_until(lambda: not Gate.is_locked("pc"), "the worker to release the lock")
    assert count(redis_client, "done", "pc") == 1
    assert queue.queue.job_ids == []  # no second job was enqueued


def test_a_misspelt_or_refused_unique_option_is_a_configuration_error(rq_redis: redis.Redis) -> None:
    with pytest.raises(ConfigurationError) as misspelt:
        enqueue_call(Gate, ("x",), unique_on_conflit="raise")
    assert "enqueue_call(): 'unique_on_conflit' is not a uniqjob setting" in str(misspelt.value)
    assert "did you mean 'unique_on_conflict'?" in str(misspelt.value)
    with pytest.raises(
        ConfigurationError, match="unique_run_lease cannot be given for one call: the run lock"
    ):
        enqueue_call(Gate, ("x",), unique_run_lease=5)
    with pytest.raises(ConfigurationError, match="must be one of log, discard, raise, reschedule"):
        enqueue_call(Gate, ("x",), unique_on_conflict="drop")
    assert not Gate.is_locked("x") and queue.queue.job_ids == []
