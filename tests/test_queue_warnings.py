"""Queue integrations set up so that locks silently strand: warned about, naming the fix."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
import redis
import rq

import uniqjob
from tests.redis_server import RedisServer
from uniqjob import UniqueJob
from uniqjob.integrations.celery import CeleryQueue, UniqueTask
from uniqjob.integrations.rq import RQQueue

from .celery_app import app


def _rq(redis_server: RedisServer) -> RQQueue:
    return RQQueue(
        rq.Queue(f"warnings-{uuid.uuid4().hex[:8]}", connection=redis.Redis.from_url(redis_server.url))
    )


def _job(queue: RQQueue, **settings: Any) -> type[UniqueJob]:
    def perform(self: Any, n: int) -> int:
        return n

    return type("Report", (UniqueJob,), {"unique_queue": queue, "perform": perform, **settings})


def _store_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "only this host sees" in r.getMessage()]


def test_a_queue_on_the_per_host_default_store_is_warned_about_once_per_class(
    redis_server: RedisServer, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="uniqjob")
    job, other = _job(_rq(redis_server)), _job(_rq(redis_server))
    job.enqueue(1)
    job.enqueue(2)
    other.enqueue(1)
    warned = _store_warnings(caplog)
    assert len(warned) == 2  # once for each class, not for each enqueue
    assert f"{job.job_name()}: its locks are in the default file store" in warned[0]
    assert "uniqjob.configure('redis://HOST:6379/0')" in warned[0] and "UNIQJOB_URL=" in warned[0]


def test_a_chosen_store_is_not_warned_about(
    redis_server: RedisServer,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.WARNING, logger="uniqjob")
    uniqjob.configure(redis_server.url)
    _job(_rq(redis_server)).enqueue(1)
    uniqjob.configure(None)
    monkeypatch.setenv("UNIQJOB_URL", redis_server.url)
    _job(_rq(redis_server)).enqueue(1)
    monkeypatch.delenv("UNIQJOB_URL")
    _job(_rq(redis_server), unique_backend=redis_server.url).enqueue(1)
    assert _store_warnings(caplog) == []


def test_the_default_store_made_before_configure_is_still_the_implicit_one() -> None:
    assert uniqjob.config.default_is_implicit()
    uniqjob.default_backend()
    assert uniqjob.config.default_is_implicit()
    uniqjob.configure("memory://")
    assert not uniqjob.config.default_is_implicit()


def test_which_queues_can_prove_a_job_gone(redis_server: RedisServer) -> None:
    assert _rq(redis_server).proves_jobs_gone
    assert not CeleryQueue(UniqueTask).proves_jobs_gone


def _make_task(**options: Any) -> Any:
    def work(account_id: int) -> None:
        pass

    task = app.task(base=UniqueTask, name=f"tests.warn.{uuid.uuid4().hex}", shared=False, **options)(work)
    return task.name  # Celery makes tasks lazily: touch it


def test_a_celery_task_with_no_autoexpire_is_warned_about_at_definition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="uniqjob")
    _make_task()
    (message,) = [r.getMessage() for r in caplog.records if "unique_lock_autoexpire" in r.getMessage()]
    assert "(CeleryQueue) cannot prove a job gone" in message
    assert "a purged task) never clears" in message
    assert "set unique_lock_autoexpire to seconds" in message
    caplog.clear()
    _make_task(unique_lock_autoexpire=3600)
    _make_task(unique_strategy="while_executing")  # no queue lock to strand
    assert not [r for r in caplog.records if "unique_lock_autoexpire" in r.getMessage()]
