"""The Dramatiq integration against real ``dramatiq`` worker processes: Redis (the session's own
redis-server as broker and lock store) and RabbitMQ where the machine runs one.

The actors are tests/dramatiq_app.py's (Redis) and tests/dramatiq_rabbit.py's (RabbitMQ).
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

import uniqjob
from tests.integration_workers import NODE_VAR, URL_VAR, Workers, count, open_gate, wait_until, worker_pool
from tests.redis_server import RedisServer
from uniqjob import Parked, Pending
from uniqjob.integrations.dramatiq import job_of
from uniqjob.locks import LockState

AMQP_URL = os.environ.get("UNIQJOB_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2F")
#: The queue of this session's actors: its own, so that nothing else's messages reach it.
QUEUE = f"uniqjob-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def app(redis_server: RedisServer) -> ModuleType:
    """tests/dramatiq_app.py, imported once the session's redis-server (its broker) is up."""
    os.environ[URL_VAR] = redis_server.url
    os.environ["UNIQJOB_TEST_DRAMATIQ_QUEUE"] = QUEUE
    from tests import dramatiq_app

    return dramatiq_app


@pytest.fixture
def workers(
    app: ModuleType, redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> Iterator[Workers]:
    uniqjob.configure(redis_server.url)
    with worker_pool(redis_server.url, tmp_path) as pool:
        pool.env["UNIQJOB_TEST_DRAMATIQ_QUEUE"] = QUEUE
        yield pool
    uniqjob.configure(None)


def start_worker(
    workers: Workers, name: str = "dramatiq", module: str = "tests.dramatiq_app", **env: str
) -> None:
    """``dramatiq MODULE``: one process, one thread, on the session's queue; waits until it is ready."""
    argv = [sys.executable, "-m", "dramatiq", module, "-p", "1", "-t", "1", "-Q", QUEUE]
    workers.start(name, argv, **env)
    wait_until(lambda: "ready for action" in workers.log(name), f"worker {name} to be ready", timeout=30)


def state(actor: Any, *args: object) -> LockState:
    return uniqjob.default_backend().read(job_of(actor).lock_key(*args))


def test_a_duplicate_is_dropped_while_queued_and_running_and_a_killed_worker_s_lock_reclaimed(
    app: ModuleType, workers: Workers, redis_client: redis.Redis
) -> None:
    gate = app.gate
    message = gate.send("a")
    assert gate.send("a") is None  # queued
    start_worker(workers, "first")
    wait_until(lambda: count(redis_client, "started", "a") == 1, "the actor to start")
    running = state(gate, "a")
    assert running.queue is not None and running.queue.state == "running"
    assert running.queue.meta.job_id == message.message_id
    assert running.run is not None and running.run.holder.pid != os.getpid()  # held by the worker
    assert [gate.send("a") for _ in range(10)] == [None] * 10  # running

    workers.kill("first")  # mid-run: its pid is gone, so its lock is an orphan at once
    again = gate.send("a")
    assert again is not None and again.message_id != message.message_id
    start_worker(workers, "second")
    open_gate(redis_client, "a")
    wait_until(lambda: count(redis_client, "done", "a") == 1, "the new message to run")
    wait_until(lambda: not job_of(gate).is_locked("a"), "its lock to go")


@pytest.mark.slow
def test_a_killed_worker_elsewhere_is_reclaimed_within_one_lease(
    app: ModuleType, workers: Workers, redis_client: redis.Redis
) -> None:
    gate = app.gate
    start_worker(workers, "remote", **{NODE_VAR: "another-machine"})
    gate.send("r")
    wait_until(lambda: count(redis_client, "started", "r") == 1, "the actor to start")
    workers.kill("remote")
    assert gate.send("r") is None  # another machine's pid cannot be checked: wait for the lease
    lease = job_of(gate).unique_run_lease
    waited = wait_until(lambda: gate.send("r") is not None, "the lease to lapse", timeout=10)
    assert waited <= lease + 1.0


@pytest.mark.slow
def test_a_retry_keeps_the_lock_and_the_last_failure_frees_it(
    app: ModuleType, workers: Workers, redis_client: redis.Redis
) -> None:
    flaky = app.flaky
    first = flaky.send("f", 5)
    start_worker(workers)
    wait_until(lambda: count(redis_client, "started", "f") == 1, "attempt 1")
    open_gate(redis_client, "f:1")

    def waiting_for_retry() -> bool:
        now = state(flaky, "f", 5)
        return now.queue is not None and now.queue.state == "queued" and now.run is None

    wait_until(waiting_for_retry, "the lock to wait, queued, for the retry")
    between = state(flaky, "f", 5)
    assert between.queue is not None and between.queue.token == first.options["uniqjob"]["token"]
    assert flaky.send("f", 5) is None  # still unique while the retry waits
    wait_until(lambda: count(redis_client, "started", "f") == 2, "attempt 2")
    open_gate(redis_client, "f:2")
    wait_until(lambda: count(redis_client, "started", "f") == 3, "attempt 3")
    assert flaky.send("f", 5) is None
    open_gate(redis_client, "f:3")  # out of retries: dead-lettered
    wait_until(lambda: not job_of(flaky).is_locked("f", 5), "the lock to go with the last attempt")
    assert count(redis_client, "done", "f") == 0


@pytest.mark.slow
def test_a_message_past_its_max_age_frees_its_lock(
    app: ModuleType, workers: Workers, redis_client: redis.Redis
) -> None:
    app.gate.send_with_options(args=("old",), max_age=1)
    assert job_of(app.gate).is_locked("old")
    start_worker(workers)  # takes it after its max_age: dropped, dead-lettered
    wait_until(lambda: not job_of(app.gate).is_locked("old"), "the lock to go")
    assert count(redis_client, "started", "old") == 0


@pytest.mark.slow
def test_block_parks_and_a_reschedule_comes_back(
    app: ModuleType, workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers)
    app.one_at_a_time.send("s1")
    assert isinstance(app.one_at_a_time.send("s2"), Parked)
    wait_until(lambda: count(redis_client, "started", "s1") == 1, "s1 to start")
    open_gate(redis_client, "s1")
    wait_until(lambda: count(redis_client, "started", "s2") == 1, "s2, parked, to be sent and run")
    open_gate(redis_client, "s2")

    app.rescheduled.send("r")
    wait_until(lambda: count(redis_client, "started", "r") == 1, "r to start")
    assert app.rescheduled.send("r") is None  # sent again, later
    open_gate(redis_client, "r")
    wait_until(lambda: count(redis_client, "started", "r") == 2, "the rescheduled send to run")
    wait_until(lambda: not job_of(app.rescheduled).is_locked("r"), "its lock to go")


def _rabbitmq_reachable() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _rabbitmq_reachable(), reason="no RabbitMQ at 127.0.0.1:5672 (guest/guest)")
def test_on_rabbitmq_duplicates_a_killed_worker_s_message_and_a_retry_keep_the_lock(
    app: ModuleType, workers: Workers, redis_client: redis.Redis
) -> None:
    workers.env["UNIQJOB_TEST_AMQP_URL"] = os.environ["UNIQJOB_TEST_AMQP_URL"] = AMQP_URL
    from tests import dramatiq_rabbit as rabbit

    try:
        rabbit.gate.send("q")
        assert rabbit.gate.send("q") is None
        start_worker(workers, module="tests.dramatiq_rabbit")
        wait_until(lambda: count(redis_client, "started", "q") == 1, "the actor to start")
        assert rabbit.gate.send("q") is None
        workers.kill("dramatiq")  # mid-run: RabbitMQ delivers the message again, to the next worker
        start_worker(workers, "again", module="tests.dramatiq_rabbit")
        wait_until(lambda: count(redis_client, "started", "q") == 2, "the message to run again")
        assert rabbit.gate.send("q") is None  # its own lock re-taken: still unique
        open_gate(redis_client, "q")
        wait_until(lambda: not job_of(rabbit.gate).is_locked("q"), "its lock to go")
        assert count(redis_client, "done", "q") == 1

        rabbit.flaky.send("rf", 1)
        wait_until(lambda: count(redis_client, "started", "rf") == 1, "attempt 1")
        open_gate(redis_client, "rf:1")
        wait_until(lambda: state(rabbit.flaky, "rf", 1).run is None, "attempt 1 to fail")
        assert rabbit.flaky.send("rf", 1) is None  # still unique while the retry waits
        open_gate(redis_client, "rf:2")
        wait_until(lambda: count(redis_client, "done", "rf") == 1, "attempt 2 to succeed")
        wait_until(lambda: not job_of(rabbit.flaky).is_locked("rf", 1), "its lock to go")
    finally:
        rabbit.broker.flush_all()
        rabbit.delete_queues()


# -- the conflict policies: use_existing, keep_last, debounce ("replace": refused, see test_dramatiq) --


def versions(r: redis.Redis, name: str) -> list[int]:
    return [int(v) for v in r.lrange(f"versions:{name}", 0, -1)]


@pytest.mark.slow
def test_keep_last_runs_the_queued_message_with_the_last_send_and_50_sends_while_running_once_more(
    app: ModuleType, workers: Workers, redis_client: redis.Redis
) -> None:
    latest = app.latest
    queued = latest.send("q", 0)
    assert {latest.send("q", v).message_id for v in range(1, 11)} == {queued.message_id}
    open_gate(redis_client, "q")
    start_worker(workers)
    wait_until(lambda: count(redis_client, "done", "q") == 1 and state(latest, "q", 0).free, "the queued run")
    assert versions(redis_client, "q") == [10]

    latest.send("a", 0)
    wait_until(lambda: count(redis_client, "started", "a") == 1, "the first run to start")
    triggers = [latest.send("a", v) for v in range(1, 51)]
    assert all(isinstance(t, Pending) for t in triggers)
    open_gate(redis_client, "a")  # stays open: the next run passes too
    wait_until(lambda: count(redis_client, "done", "a") == 2, "the pending run")
    wait_until(lambda: state(latest, "a", 0).free, "the lock to go")
    assert versions(redis_client, "a") == [0, 50]


@pytest.mark.slow
def test_50_sends_in_a_debounced_burst_run_once_with_the_last(
    app: ModuleType, workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers)
    sent = [app.debounced.send("d", v) for v in range(1, 51)]
    assert {m.message_id for m in sent} == {sent[0].message_id}
    queued = state(app.debounced, "d", 0).queue
    assert queued is not None and queued.due is not None and queued.meta.args == "'d', 50"
    wait_until(lambda: count(redis_client, "done", "d") == 1, "the debounced run")
    wait_until(lambda: state(app.debounced, "d", 0).free, "the lock to go")
    assert versions(redis_client, "d") == [50]


@pytest.mark.slow
def test_use_existing_messages_read_the_first_message_s_result(
    app: ModuleType, workers: Workers, redis_client: redis.Redis
) -> None:
    existing = app.existing
    first = existing.send("u")
    queued = existing.send("u")  # while queued
    start_worker(workers)
    wait_until(lambda: count(redis_client, "started", "u") == 1, "the actor to start")
    running = existing.send("u")  # while running
    assert queued.message_id == running.message_id == first.message_id
    open_gate(redis_client, "u")
    assert running.get_result(backend=app.results, block=True, timeout=20_000) == "u"
    assert queued.get_result(backend=app.results) == "u"
    assert count(redis_client, "started", "u") == 1
