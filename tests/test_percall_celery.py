"""Celery: ``apply_async(..., unique_*=...)`` applies uniqjob settings to that call (issue 23, §1).

They are applied, checked as class settings are, and never handed to Celery's
publish; a real ``celery worker`` runs a task sent with them under its lock.
"""

from __future__ import annotations

import pytest
import redis

from tests.celery_app import QUEUE, echo, export, gate
from tests.integration_workers import Workers, count, open_gate, wait_until
from tests.test_celery import broker, start_worker, state, workers  # the worker, and the fixtures
from uniqjob import ConfigurationError, JobNotUnique

__all__ = ["broker", "workers"]


def _published(r: redis.Redis) -> list[bytes]:
    """The raw messages waiting in the test queue (kombu's Redis transport keeps them in a list)."""
    return [m if isinstance(m, bytes) else m.encode() for m in r.lrange(QUEUE, 0, -1)]


def test_apply_async_applies_unique_options_to_its_call_and_does_not_publish_them(
    broker: redis.Redis,
) -> None:
    assert echo.apply_async((11,), unique_lock_autoexpire=7) is not None
    held = state(echo, 11).queue
    assert held is not None and held.ttl is not None and 6 < held.ttl <= 7  # this call's autoexpire
    with pytest.raises(JobNotUnique) as raised:
        echo.apply_async((11,), unique_on_conflict="raise")
    assert raised.value.holder["clears_by"] == "autoexpire"
    assert 5 < raised.value.holder["clears_in"] <= 7
    assert echo.apply_async((11,)) is None  # the task's own "log" again
    assert echo.apply_async((12,), countdown=100, unique_lock_autoexpire=5) is not None
    later = state(echo, 12).queue
    assert later is not None and later.ttl is not None and 104 < later.ttl <= 105  # countdown counts in
    messages = _published(broker)
    assert len(messages) == 2 and all(b"unique_" not in m for m in messages)  # nothing for Celery


def test_per_call_options_go_through_signatures_too(broker: redis.Redis) -> None:
    assert export.delay(5) is not None
    with pytest.raises(JobNotUnique):
        export.delay(5)  # the class's "raise"
    assert export.apply_async((5,), unique_on_conflict="log") is None
    assert export.signature((5,), unique_on_conflict="discard").apply_async() is None
    assert export.s(5).set(unique_on_conflict="discard").delay() is None
    assert len(_published(broker)) == 1


def test_a_misspelt_or_refused_unique_option_is_a_configuration_error(broker: redis.Redis) -> None:
    with pytest.raises(ConfigurationError) as misspelt:
        echo.apply_async((13,), unique_on_conflit="raise")
    assert "'unique_on_conflit' is not a uniqjob setting" in str(misspelt.value)
    assert "did you mean 'unique_on_conflict'?" in str(misspelt.value)
    assert str(misspelt.value).startswith("tests.celery_app.echo.apply_async(): ")
    with pytest.raises(ConfigurationError, match="unique_strategy cannot be given for one call: it decides"):
        echo.apply_async((13,), unique_strategy="until_executing")
    with pytest.raises(ConfigurationError, match="unique_lock_autoexpire must be positive"):
        echo.apply_async((13,), unique_lock_autoexpire=0)
    assert not echo.is_locked(13) and _published(broker) == []  # nothing locked, nothing sent


def test_a_task_sent_with_settings_for_its_call_runs_under_its_lock(
    workers: Workers, broker: redis.Redis
) -> None:
    start_worker(workers)
    result = gate.apply_async(("pc",), unique_lock_autoexpire=60, unique_on_conflict="raise")
    assert result is not None
    wait_until(lambda: count(broker, "started", "pc") == 1, "the task to start")
    running = state(gate, "pc")
    # the worker took over the lock this call took: the same key, found by the class's own
    assert running.queue is not None and running.queue.state == "running"
    assert running.queue.meta.job_id == result.id and running.run is not None
    with pytest.raises(JobNotUnique) as raised:
        gate.apply_async(("pc",), unique_on_conflict="raise")
    assert raised.value.holder["clears_by"] == "lease"  # the run lease (1 s) ends it before autoexpire
    assert 0 < raised.value.holder["clears_in"] <= 1
    assert gate.delay("pc") is None
    open_gate(broker, "pc")
    wait_until(lambda: not gate.is_locked("pc"), "the worker to release the lock")
    assert count(broker, "started", "pc") == count(broker, "done", "pc") == 1
