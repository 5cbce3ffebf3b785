"""arq: ``enqueue_call(..., unique_*=...)`` and ``Job.using(...)`` on a real arq worker (issue 23, §1)."""

from __future__ import annotations

import pytest
import redis

pytest.importorskip("arq", reason="arq is not installed: pip install --no-deps 'arq>=0.28'")

from arq.jobs import Job

from tests.arq_jobs import Gate
from tests.integration_workers import Workers, count, open_gate, wait_until
from tests.test_arq import run, start_worker, state, workers  # the worker, and the fixture
from uniqjob import ConfigurationError, JobNotUnique, UniqueJob
from uniqjob.integrations.arq import enqueue_call

__all__ = ["workers"]


def test_enqueue_call_takes_settings_for_its_call(workers: Workers, redis_client: redis.Redis) -> None:
    job = run(enqueue_call(Gate, ("pc",), unique_lock_autoexpire=60))
    assert isinstance(job, Job)
    held = state(Gate, "pc").queue
    assert held is not None and held.meta.job_id == job.job_id
    assert held.ttl is not None and 59 < held.ttl <= 60  # this call's autoexpire
    with pytest.raises(JobNotUnique) as raised:
        run(enqueue_call(Gate, ("pc",), unique_on_conflict="raise"))
    assert raised.value.holder["clears_by"] == "autoexpire"
    with pytest.raises(JobNotUnique):
        run(Gate.using(on_conflict="raise").aenqueue("pc"))
    assert run(Gate.aenqueue("pc")) is None  # the class's "log"

    start_worker(workers)
    wait_until(lambda: count(redis_client, "started", "pc") == 1, "the job to start")
    open_gate(redis_client, "pc")
    wait_until(lambda: not Gate.is_locked("pc"), "the worker to release the lock")
    assert count(redis_client, "done", "pc") == 1


def test_a_misspelt_or_refused_unique_option_is_a_configuration_error(workers: Workers) -> None:
    with pytest.raises(ConfigurationError) as misspelt:
        run(enqueue_call(Gate, ("x",), unique_on_conflit="raise"))
    assert "enqueue_call(): 'unique_on_conflit' is not a uniqjob setting" in str(misspelt.value)
    with pytest.raises(ConfigurationError, match="unique_strategy cannot be given for one call"):
        run(enqueue_call(Gate, ("x",), unique_strategy="while_executing"))
    with pytest.raises(ConfigurationError, match="'_defer_by' is not a uniqjob setting"):
        run(enqueue_call(Gate, ("x",), _defer_by=5))

    class Inline(UniqueJob):
        async def perform(self) -> None:
            pass

    with pytest.raises(ConfigurationError, match="unique_queue is None, not an ArqQueue"):
        run(enqueue_call(Inline))
    assert not Gate.is_locked("x")
