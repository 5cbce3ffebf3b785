"""The Celery integration against real ``celery worker`` processes; the test redis-server is the broker."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import Reject, Retry
from celery.result import AsyncResult
from kombu.exceptions import OperationalError

import uniqjob
from tests.celery_app import (
    QUEUE,
    VISIBILITY_VAR,
    Export,
    app,
    debounced,
    echo,
    expiring,
    export,
    flaky,
    gate,
    late_gate,
    latest,
    once_a_while,
    one_at_a_time,
    order_step,
    pair,
    replaced,
    requeued_gate,
    rescheduled,
    slow_gate,
)
from tests.integration_workers import NODE_VAR, REPO, URL_VAR, Workers, count, open_gate, wait_until
from tests.redis_server import RedisServer
from uniqjob import ConfigurationError, JobNotUnique, Parked, Pending
from uniqjob.concurrency import Park
from uniqjob.concurrency.codec import encode_call
from uniqjob.integrations import job_ref, resolve_job
from uniqjob.integrations.celery import UniqueTask
from uniqjob.locks import Holder, LockState, local_holder


@pytest.fixture
def broker(
    redis_server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> redis.Redis:
    """The test Redis as lock store and broker, flushed."""
    monkeypatch.setenv(URL_VAR, redis_server.url)
    uniqjob.configure(redis_server.url)
    app.conf.broker_url = redis_server.url
    return redis_client


@pytest.fixture
def workers(broker: redis.Redis, tmp_path: Path) -> Iterator[Workers]:
    url = os.environ[URL_VAR]
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    pool = Workers(tmp_path, {URL_VAR: url, "UNIQJOB_URL": url, "PYTHONPATH": path})
    yield pool
    pool.close()
    print(f"----- broker -----\n{broker_state(broker)}")  # shown with the worker logs if the test failed


def broker_state(broker: redis.Redis) -> str:
    """What the broker holds (each key, and a list's length) and who is connected: where a lost task went."""
    lines = []
    for key in sorted(broker.scan_iter(count=1000)):
        kind = broker.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        lines.append(f"{key!r} {kind}" + (f" len={broker.llen(key)}" if kind == "list" else ""))
    clients = broker.client_list()
    lines += [f"client {c['addr']} cmd={c['cmd']} age={c['age']}s idle={c['idle']}s" for c in clients]
    return "\n".join(lines)


def start_worker(workers: Workers, name: str = "celery", queue: str = QUEUE, **env: str) -> None:
    """A ``celery worker``: one prefork child, so its main process stays free for control commands."""
    argv = [sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker", "-P", "prefork", "-c", "1"]
    argv += ["--prefetch-multiplier", "1", "-Q", queue, "-n", f"{name}-{uuid.uuid4().hex[:8]}@%h"]
    argv += ["--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"]
    workers.start(name, argv, **env)
    # Consuming before the test publishes: a task published during a worker's start was once seen
    # never delivered to it (slow tier, loaded machine; the broker's state is printed if it recurs).
    wait_until(lambda: " ready." in workers.log(name), f"worker {name} to be ready", timeout=30)


def state(task: Any, *args: object) -> LockState:
    return uniqjob.default_backend().read(task.unique_job.lock_key(*args))


def test_duplicates_while_a_task_runs_run_once(workers: Workers, broker: redis.Redis) -> None:
    start_worker(workers)
    result = gate.delay("a")
    assert result is not None
    wait_until(lambda: count(broker, "started", "a") == 1, "the task to start")
    running = state(gate, "a")
    assert running.queue is not None and running.queue.state == "running"
    assert running.queue.meta.job_id == result.id  # the queue lock records the task id
    assert running.run is not None and running.run.holder.pid != os.getpid()  # held by the pool child

    assert [gate.delay("a") for _ in range(25)] == [None] * 25
    assert gate.apply_async(("a",), countdown=5) is None
    assert gate.delay("b") is not None  # another key is free

    open_gate(broker, "a")
    open_gate(broker, "b")
    wait_until(lambda: not gate.is_locked("a") and not gate.is_locked("b"), "both locks to go")
    assert count(broker, "started", "a") == count(broker, "done", "a") == 1

    # Published around uniqjob, by name: the worker still locks it, by its arguments.
    app.send_task("tests.celery_app.gate", ("h",))
    wait_until(lambda: count(broker, "started", "h") == 1, "the task sent by name to start")
    assert gate.delay("h") is None
    open_gate(broker, "h")
    wait_until(lambda: not gate.is_locked("h"), "its lock to go")


@pytest.mark.slow
def test_a_duplicate_sent_by_name_is_dropped_and_logged_like_any_other(
    workers: Workers, broker: redis.Redis
) -> None:
    start_worker(workers, "first")
    gate.delay("n")
    wait_until(lambda: count(broker, "started", "n") == 1, "the task to start")
    start_worker(workers, "second", queue="uniqjob-test-2")  # takes the duplicate while the first runs
    # no uniqjob header: locked by its arguments
    app.send_task("tests.celery_app.gate", ("n",), queue="uniqjob-test-2")
    wait_until(lambda: "succeeded" in workers.log("second"), "the second worker to drop the duplicate")
    log = workers.log("second")
    assert "tests.celery_app.gate dropped: " in log and "is already locked" in log
    assert "ERROR" not in log and "Traceback" not in log and "JobNotUnique" not in log
    assert count(broker, "started", "n") == 1
    assert gate.is_locked("n")  # the first run's lock is untouched
    open_gate(broker, "n")
    wait_until(lambda: not gate.is_locked("n"), "its lock to go")


@pytest.mark.slow
def test_until_expired_holds_after_the_task_ran_until_autoexpire(
    workers: Workers, broker: redis.Redis
) -> None:
    open_gate(broker, "x")  # the task ends as soon as it starts
    start_worker(workers)
    assert once_a_while.delay("x") is not None
    sent = time.monotonic()
    wait_until(lambda: count(broker, "done", "x") == 1, "the task to run")
    while time.monotonic() - sent < 2.5:
        assert once_a_while.is_locked("x") and once_a_while.delay("x") is None
        time.sleep(0.1)
    wait_until(lambda: not once_a_while.is_locked("x"), "the lock to expire", timeout=5)
    assert time.monotonic() - sent >= 2.9
    assert once_a_while.delay("x") is not None
    wait_until(lambda: count(broker, "done", "x") == 2, "the next period's task to run")


def test_killed_worker_is_reclaimed_at_once_on_its_host(workers: Workers, broker: redis.Redis) -> None:
    start_worker(workers, "first")
    gate.delay("k")
    wait_until(lambda: count(broker, "started", "k") == 1, "the task to start")
    assert gate.delay("k") is None  # a live task is never robbed
    workers.kill("first")  # main process and pool child, mid-task
    assert gate.delay("k") is not None  # the child's pid is gone: provably dead, reclaimed at once


@pytest.mark.slow
def test_killed_worker_elsewhere_is_reclaimed_within_one_lease(workers: Workers, broker: redis.Redis) -> None:
    start_worker(workers, "remote", **{NODE_VAR: "another-machine"})
    gate.delay("r")
    wait_until(lambda: count(broker, "started", "r") == 1, "the task to start")
    lease = float(gate.unique_job.unique_run_lease)
    time.sleep(lease * 1.5)  # alive across leases: its heartbeat keeps the lock
    assert gate.delay("r") is None
    workers.kill("remote")
    assert gate.delay("r") is None  # another machine's pid cannot be checked: wait for the lease
    waited = wait_until(lambda: gate.delay("r") is not None, "the lease to lapse", timeout=10)
    assert waited <= lease + 1.0


@pytest.mark.slow
def test_acks_late_redelivery_after_a_crash_readopts_its_lock(workers: Workers, broker: redis.Redis) -> None:
    start_worker(workers, "first")
    late_gate.delay("x")
    wait_until(lambda: count(broker, "started", "x") == 1, "the task to start")
    token = state(late_gate, "x").run.token  # type: ignore[union-attr]
    workers.kill("first")  # the message was never acknowledged

    # Redis hands an unacknowledged message on once it is older than visibility_timeout
    # (1 s for the second worker); older kombu only looks when the worker starts.
    time.sleep(1.2)
    start_worker(workers, "second", **{VISIBILITY_VAR: "1"})
    wait_until(lambda: count(broker, "started", "x") == 2, "the message to be delivered again")
    again = state(late_gate, "x")
    assert again.queue is not None and again.run is not None
    assert again.queue.token == again.run.token == token  # its own lock, re-taken: not a duplicate
    assert again.queue.state == "running"
    assert late_gate.delay("x") is None
    open_gate(broker, "x")
    wait_until(lambda: count(broker, "done", "x") == 1, "the redelivered task to finish")
    wait_until(lambda: not late_gate.is_locked("x"), "its lock to go")
    assert list(uniqjob.default_backend().scan()) == []  # nothing stale left


@pytest.mark.parametrize("task", [late_gate, requeued_gate], ids=["acks_late", "reject_on_worker_lost"])
@pytest.mark.slow
def test_a_killed_pool_child_is_run_again_only_with_reject_on_worker_lost(
    workers: Workers, broker: redis.Redis, task: Any
) -> None:
    start_worker(workers)
    task.delay("c")
    wait_until(lambda: count(broker, "started", "c") == 1, "the task to start")
    token = state(task, "c").run.token  # type: ignore[union-attr]
    os.kill(int(broker.lrange("pids:c", 0, 0)[0]), signal.SIGKILL)  # the pool child only
    wait_until(lambda: "WorkerLostError" in workers.log("celery"), "the worker to see its child die")
    if task is late_gate:
        # acks_late alone: the worker fails the task and acknowledges it; nothing runs it again
        wait_until(lambda: broker.hlen("unacked") == 0, "the message to be acknowledged")
        assert count(broker, "started", "c") == 1
        assert not task.is_locked("c")  # its holder is dead: the next call reclaims the lock at once
        assert task.delay("c") is not None
        wait_until(lambda: count(broker, "started", "c") == 2, "the new call to run")
    else:
        # the message goes back to the queue: the new pool child runs it, under its own lock
        wait_until(lambda: count(broker, "started", "c") == 2, "the message to be delivered again")
        again = state(task, "c")
        assert again.queue is not None and again.run is not None
        assert again.queue.token == again.run.token == token and again.queue.state == "running"
        assert task.delay("c") is None
    open_gate(broker, "c")
    wait_until(lambda: count(broker, "done", "c") == 1, "the second run to finish")
    wait_until(lambda: not task.is_locked("c"), "its lock to go")
    assert list(uniqjob.default_backend().scan()) == []


@pytest.mark.slow
def test_retries_keep_the_lock_until_the_last_attempt(workers: Workers, broker: redis.Redis) -> None:
    start_worker(workers)
    result = flaky.delay("f", 1)
    wait_until(lambda: count(broker, "started", "f") == 1, "attempt 1")
    first = state(flaky, "f", 1)
    assert first.queue is not None
    open_gate(broker, "f:1")  # attempt 1 calls self.retry(countdown=1)

    def waiting_for_retry() -> bool:
        now = state(flaky, "f", 1)
        return now.queue is not None and now.queue.state == "queued" and now.run is None

    wait_until(waiting_for_retry, "the lock to wait, queued, for the retry")
    between = state(flaky, "f", 1)
    assert between.queue is not None
    assert between.queue.token == first.queue.token and between.queue.meta.job_id == result.id
    assert flaky.delay("f", 1) is None  # still unique while the retry waits
    open_gate(broker, "f:retry")  # tests/celery_app.py holds the retry until now

    wait_until(lambda: count(broker, "started", "f") == 2, "attempt 2")
    open_gate(broker, "f:2")
    wait_until(lambda: count(broker, "done", "f") == 1, "attempt 2 to succeed")
    wait_until(lambda: not flaky.is_locked("f", 1), "the lock to go after the last attempt")

    flaky.delay("d", 99, False)  # fails for good after two retries
    wait_until(lambda: count(broker, "started", "d") == 3, "all three attempts")
    wait_until(lambda: not flaky.is_locked("d", 99, False), "the lock to go after the final failure")


def test_revoke_releases_the_lock_and_the_concurrency_slot(workers: Workers, broker: redis.Redis) -> None:
    start_worker(workers)
    pair.delay("busy")
    wait_until(lambda: count(broker, "started", "busy") == 1, "the worker to be busy")
    victim = pair.delay("victim")
    assert victim is not None and pair.is_locked("victim")
    token = state(pair, "victim").queue.token  # type: ignore[union-attr]
    assert isinstance(pair.delay("parked"), Parked)  # both slots are taken
    wait_until(lambda: broker.llen(QUEUE) == 0, "the worker to receive the task, behind the busy one")
    app.control.revoke(victim.id)
    # at once, while the worker is still busy with the task ahead of it
    wait_until(lambda: not pair.is_locked("victim"), "the revoked task's lock to go", timeout=5)
    semaphore = pair.unique_job.semaphore("victim")
    # its slot goes in the same handler (just after the lock), not when its 15-minute lease lapses
    wait_until(
        lambda: token not in {s.token for s in semaphore.read().slots},
        "the revoked task's slot to go",
        timeout=5,
    )
    assert count(broker, "done", "busy") == 0
    open_gate(broker, "busy")
    wait_until(lambda: count(broker, "started", "parked") == 1, "the parked task to run")
    assert count(broker, "started", "victim") == 0
    open_gate(broker, "parked")
    wait_until(lambda: not pair.is_locked("parked"), "its lock to go")


@pytest.mark.slow
@pytest.mark.parametrize("signum", ["SIGTERM", "SIGKILL", "SIGQUIT", "SIGHUP", "SIGUSR1"])
def test_revoke_terminate_releases_a_running_task_s_lock_at_once(
    workers: Workers, broker: redis.Redis, signum: str
) -> None:
    """Whatever the signal: the worker releases the lock once the child is dead (SIGKILL: no last word)."""
    start_worker(workers)
    result = slow_gate.delay("t")
    assert result is not None
    wait_until(lambda: count(broker, "started", "t") == 1, "the task to start")
    assert not state(slow_gate, "t").free
    app.control.revoke(result.id, terminate=True, signal=signum)
    wait_until(lambda: state(slow_gate, "t").free, "the terminated task's lock to go", timeout=5)
    assert list(uniqjob.default_backend().scan()) == []  # `uniqjob locks` lists nothing
    assert count(broker, "done", "t") == 0
    again = slow_gate.delay("t")  # the worker is free again: the next call runs
    assert again is not None
    wait_until(lambda: count(broker, "started", "t") == 2, "the next call to run")
    open_gate(broker, "t")
    wait_until(lambda: state(slow_gate, "t").free, "its lock to go")


@pytest.mark.slow
def test_revoke_terminate_with_a_signal_the_child_ignores_leaves_its_running_task_locked(
    workers: Workers, broker: redis.Redis
) -> None:
    """A Celery pool child ignores SIGINT: its task runs on, and keeps its lock until it ends."""
    start_worker(workers)
    result = slow_gate.delay("i")
    assert result is not None
    wait_until(lambda: count(broker, "started", "i") == 1, "the task to start")
    app.control.revoke(result.id, terminate=True, signal="SIGINT")
    wait_until(lambda: "Terminating " in workers.log("celery"), "the worker to signal its child")
    time.sleep(0.5)  # what the worker's watch would have done by now
    assert not state(slow_gate, "i").free and slow_gate.delay("i") is None  # still unique while it runs
    open_gate(broker, "i")
    wait_until(lambda: count(broker, "done", "i") == 1, "the task to end")
    wait_until(lambda: state(slow_gate, "i").free, "its lock to go")


@pytest.mark.slow
def test_reschedule_goes_through_the_broker(workers: Workers, broker: redis.Redis) -> None:
    start_worker(workers)
    rescheduled.delay("s")
    wait_until(lambda: count(broker, "started", "s") == 1, "the first run")
    assert rescheduled.delay("s") is None  # held: tried again a second later, by a worker
    open_gate(broker, "s")
    wait_until(lambda: count(broker, "done", "s") == 2, "the rescheduled call to run")
    wait_until(lambda: not rescheduled.is_locked("s"), "its lock to go")


def test_block_parks_and_a_promotion_publishes_the_task(workers: Workers, broker: redis.Redis) -> None:
    start_worker(workers)
    assert one_at_a_time.delay("p1") is not None
    wait_until(lambda: count(broker, "started", "p1") == 1, "the first task to start")
    parked = one_at_a_time.delay("p2")
    assert parked is not None and not isinstance(parked, AsyncResult)  # parked, not published yet
    assert one_at_a_time.is_locked("p2")
    open_gate(broker, "p1")
    wait_until(lambda: count(broker, "started", "p2") == 1, "the parked task to be published and run")
    assert count(broker, "done", "p1") == 1  # only once the first gave up its slot
    open_gate(broker, "p2")
    wait_until(lambda: not one_at_a_time.is_locked("p2"), "its lock to go")


# -- without a worker ------------------------------------------------------------------------


def test_class_based_task_records_the_task_id_and_raises_on_duplicates(broker: redis.Redis) -> None:
    result = export.delay(1, note="first")
    assert result is not None
    held = state(export, 1)
    assert held.queue is not None and held.queue.meta.job_id == result.id
    with pytest.raises(JobNotUnique) as raised:
        export.delay(1, note="second")  # unique_args: only account_id counts
    assert raised.value.holder["job_id"] == result.id
    assert export.delay(2) is not None
    assert export.unique_job.job_name() == "tests.celery_app.Export"


def test_the_task_id_is_recorded_by_the_claim_and_a_duplicate_publishes_nothing(
    broker: redis.Redis,
) -> None:
    result = export.apply_async((3,), task_id="export-3")
    assert result is not None and result.id == "export-3"
    held = state(export, 3)
    assert held.queue is not None and held.queue.meta.job_id == "export-3"
    messages = broker.llen(QUEUE)
    assert messages >= 1  # the first one is there
    with pytest.raises(JobNotUnique):
        export.apply_async((3,), task_id="export-3b")
    assert broker.llen(QUEUE) == messages  # the duplicate reached no broker
    assert state(export, 3).queue.meta.job_id == "export-3"  # type: ignore[union-attr]


def test_countdown_and_eta_count_into_the_lock(broker: redis.Redis) -> None:
    expiring.apply_async(("now",))
    expiring.apply_async(("later",), countdown=100)
    expiring.apply_async(("eta",), eta=datetime.now(UTC) + timedelta(seconds=200))
    ttl = {name: state(expiring, name).queue.ttl for name in ("now", "later", "eta")}  # type: ignore[union-attr]
    assert ttl["now"] is not None and 9 < ttl["now"] <= 10
    assert ttl["later"] is not None and 109 < ttl["later"] <= 110
    assert ttl["eta"] is not None and 208 < ttl["eta"] <= 210


def test_a_countdown_counts_into_the_concurrency_slots_lease(broker: redis.Redis) -> None:
    assert pair.apply_async(("later",), countdown=3600) is not None
    (slot,) = pair.unique_job.semaphore("later").read().slots
    assert 3600 + 890 < slot.lease_left <= 3600 + 900  # concurrency_duration (15 min) after it is due


def test_a_call_promoted_during_another_apply_async_is_published_as_itself(broker: redis.Redis) -> None:
    job = pair.unique_job
    semaphore = job.semaphore("x")
    dead = _dead_holder()
    crashed = semaphore.store.acquire(
        semaphore.key, "crashed", limit=2, lease=600, running=True, holder=dead, park=None,
        job_class="", args="", caller=dead,
    )  # fmt: skip
    assert crashed.status == "taken"
    assert pair.delay("busy") is not None  # the key is full now
    first = job.lock("first")  # parked straight in the store: nobody has looked at the holders yet
    assert first.acquire()
    park = Park("queue", encode_call(job, ("first",), {}, first.key))
    parked = semaphore.store.acquire(
        semaphore.key, first.token, limit=2, lease=900, running=False, holder=None, park=park,
        job_class=job.job_name(), args="", caller=local_holder(),
    )  # fmt: skip
    assert parked.status == "parked"
    # The next call parks behind "first", finds the crashed holder dead, and promotes "first"
    # into its slot: pushed during this apply_async, yet not with its task id or its countdown.
    assert isinstance(pair.apply_async(("second",), task_id="second-id", countdown=600), Parked)
    published = [json.loads(raw) for raw in broker.lrange(QUEUE, 0, -1)]
    promoted = [m["headers"] for m in published if m["headers"]["uniqjob"]["token"] == first.token]
    assert len(promoted) == 1
    assert promoted[0]["id"] != "second-id" and promoted[0]["eta"] is None
    held = state(pair, "first").queue
    assert held is not None and held.meta.job_id == promoted[0]["id"]  # recorded once published


def test_eager_mode_runs_under_the_lock(broker: redis.Redis) -> None:
    app.conf.task_always_eager = True
    try:
        assert echo.delay(5).get() == 5
        assert not echo.is_locked(5)
        assert flaky.delay("e", 1, False).get() == 2  # the retry runs at once, holding the lock
        assert not flaky.is_locked("e", 1, False)
    finally:
        app.conf.task_always_eager = False
    assert echo(6) == 6  # a direct call is a plain function call: no lock at all


def test_a_failed_publish_releases_the_lock(broker: redis.Redis) -> None:
    down = Celery("down", broker=_dead_broker(), set_as_current=False)
    down.conf.update(task_publish_retry=False, broker_transport_options={"max_retries": 0})  # fail fast

    def ping(n: int) -> int:
        return n

    task = down.task(base=UniqueTask, name="tests.down.ping", shared=False)(ping)
    with pytest.raises(OperationalError):
        task.delay(1)
    assert not task.is_locked(1)  # nothing stuck: the next call gets the lock
    assert uniqjob.default_backend().read(task.unique_job.lock_key(1)).free


def _bounce(self: UniqueTask, n: int) -> None:
    raise self.retry(countdown=30)


def _bounce_too(self: UniqueTask, n: int) -> None:  # its own class: a concurrency key of its own
    raise self.retry(countdown=30)


def _deliver(task: Any, n: int) -> Any:
    """Run ``task(n)`` here as a worker runs a delivery of a message that ``delay(n)`` published."""
    lock = task.unique_job.lock(n)
    lock.meta = replace(lock.meta, job_id=str(uuid.uuid4()))
    assert lock.acquire()
    headers = {"uniqjob": {"key": lock.key, "token": lock.token}}
    task.push_request(id=lock.meta.job_id, headers=headers, called_directly=False, args=(n,), kwargs={})
    try:
        return task(n)
    finally:
        task.pop_request()


def test_a_retry_waits_queued_with_its_lock_and_one_never_sent_releases_it(broker: redis.Redis) -> None:
    options = {"bind": True, "shared": False, "max_retries": 3, "unique_lock_autoexpire": 10}
    task = app.task(base=UniqueTask, name="tests.bounce", **options)(_bounce)
    with pytest.raises(Retry):
        _deliver(task, 1)
    waiting = state(task, 1)
    assert waiting.queue is not None and waiting.queue.state == "queued" and waiting.run is None
    assert waiting.queue.ttl is not None and 39 < waiting.queue.ttl <= 40  # autoexpire + countdown
    assert task.delay(1) is None

    down = Celery("down", broker=_dead_broker(), set_as_current=False)
    down.conf.update(task_publish_retry=False, broker_transport_options={"max_retries": 0})
    lost = down.task(base=UniqueTask, bind=True, shared=False, name="tests.lost", max_retries=3)(_bounce)
    with pytest.raises(Reject):  # Celery's answer to a retry it could not publish
        _deliver(lost, 2)
    assert not lost.is_locked(2)  # nothing will run it again: nothing keeps the key


def test_a_retry_keeps_its_concurrency_slot_and_one_never_sent_frees_it(broker: redis.Redis) -> None:
    # "discard": a class that never parks need not be importable by name, as this one is not
    limit = {"concurrency_limit": 1, "concurrency_on_conflict": "discard"}
    options = {"bind": True, "shared": False, "max_retries": 3, **limit}
    task = app.task(base=UniqueTask, name="tests.bounce_limited", **options)(_bounce)
    with pytest.raises(Retry):
        _deliver(task, 1)
    (slot,) = task.unique_job.semaphore(1).read().slots
    assert slot.status == "reserved" and slot.lease_left > 900 + 25  # kept for the retry, due in 30 s

    down = Celery("down", broker=_dead_broker(), set_as_current=False)
    down.conf.update(task_publish_retry=False, broker_transport_options={"max_retries": 0})
    lost = down.task(base=UniqueTask, name="tests.lost_limited", **options)(_bounce_too)
    with pytest.raises(Reject):
        _deliver(lost, 2)
    assert lost.unique_job.semaphore(2).read().empty  # no retry was sent: nothing keeps the slot


def test_bad_task_settings_fail_when_the_task_is_made(broker: redis.Redis) -> None:
    def work(account_id: int) -> None:
        pass

    def make(**options: Any) -> Any:
        # shared=False: a shared task would be made again for every app created later
        task = app.task(base=UniqueTask, name=f"tests.bad.{uuid.uuid4().hex}", shared=False, **options)(work)
        return task.name  # Celery makes tasks lazily: touch it

    with pytest.raises(ConfigurationError, match="unique_on_conflit is not a uniqjob setting"):
        make(unique_on_conflit="raise")
    with pytest.raises(ConfigurationError, match="unique_args names user"):
        make(unique_args=("user",))
    with pytest.raises(ConfigurationError, match="a UniqueTask's queue is Celery"):
        make(unique_queue=None)
    assert make(bind=False, unique_args=("account_id",))


def test_a_plain_function_as_the_concurrency_key_option(broker: redis.Redis) -> None:
    job = order_step.unique_job
    assert job.semaphore(7, "charge").key == job.semaphore(7, "ship").key != job.semaphore(8, "charge").key
    assert job.semaphore(7, "charge").key.endswith(":order-7")
    assert order_step.delay(7, "charge") is not None
    assert order_step.delay(7, "ship") is None  # another step of order 7: its one slot is taken
    assert order_step.delay(8, "charge") is not None


def test_a_bound_task_keys_on_its_arguments_not_on_self() -> None:
    assert flaky.unique_job.lock_key("a", 1) == flaky.unique_job.lock_key(name="a", failures=1, gated=True)
    assert Export.unique_job.lock_key(3, "x") == Export.unique_job.lock_key(3, "y")
    assert flaky.unique_job.lock_key("a", 1).startswith("tests.celery_app.flaky:")


def test_a_tasks_unique_job_is_importable_by_its_path() -> None:
    # Another process (a promoter of parked calls) finds the job class by module:QualName.
    assert resolve_job(job_ref(gate.unique_job)) is gate.unique_job
    assert job_ref(Export.unique_job) == "tests.celery_app:Export.unique_job"
    assert resolve_job("tests.celery_app:Export.unique_job") is Export.unique_job


def _dead_holder() -> Holder:
    """A holder on this host whose process has exited."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    me = local_holder()
    return Holder(me.host, me.node, proc.pid, 1)


def _dead_broker() -> str:
    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


# -- coalescing: keep_last, replace and debounce (docs/strategies.md) -----------------------------


def versions(r: redis.Redis, name: str) -> list[int]:
    return [int(v) for v in r.lrange(f"versions:{name}", 0, -1)]


@pytest.mark.slow
def test_keep_last_runs_once_more_with_the_last_of_50_triggers(workers: Workers, broker: redis.Redis) -> None:
    start_worker(workers)
    assert isinstance(latest.delay("a", 0), AsyncResult)
    wait_until(lambda: count(broker, "started", "a") == 1, "the first run to start")
    assert all(isinstance(latest.delay("a", v), Pending) for v in range(1, 51))
    open_gate(broker, "a")
    wait_until(lambda: count(broker, "done", "a") == 2 and state(latest, "a", 0).free, "the pending run")
    assert versions(broker, "a") == [0, 50]


@pytest.mark.slow
def test_a_terminated_keep_last_task_hands_on_the_call_that_waited_behind_it(
    workers: Workers, broker: redis.Redis
) -> None:
    start_worker(workers)
    first = latest.delay("k", 0)
    assert isinstance(first, AsyncResult)
    wait_until(lambda: count(broker, "started", "k") == 1, "the first run to start")
    assert isinstance(latest.delay("k", 1), Pending)
    app.control.revoke(first.id, terminate=True, signal="SIGKILL")
    wait_until(lambda: count(broker, "started", "k") == 2, "the pending call to run", timeout=10)
    open_gate(broker, "k")
    wait_until(lambda: count(broker, "done", "k") == 1 and state(latest, "k", 0).free, "its run to end")
    assert versions(broker, "k") == [0, 1]


@pytest.mark.slow
def test_replace_never_runs_the_replaced_task(workers: Workers, broker: redis.Redis) -> None:
    first = replaced.delay("r", 0)
    handles = [replaced.delay("r", v) for v in range(1, 4)]
    assert len({first.id, *(h.id for h in handles)}) == 4
    assert state(replaced, "r", 0).queue is not None
    open_gate(broker, "r")
    start_worker(workers)  # the replaced tasks are still in the broker: their start is refused
    wait_until(lambda: count(broker, "done", "r") == 1 and state(replaced, "r", 0).free, "the run")
    wait_until(lambda: broker.llen("uniqjob-test") == 0, "the broker to drain")
    assert versions(broker, "r") == [3]


@pytest.mark.slow
def test_a_debounced_burst_of_50_runs_once_with_the_last(workers: Workers, broker: redis.Redis) -> None:
    start_worker(workers)
    handles = [debounced.delay("d", v) for v in range(1, 51)]
    assert {h.id for h in handles} == {handles[0].id}
    open_gate(broker, "d")
    wait_until(lambda: count(broker, "done", "d") == 1 and state(debounced, "d", 0).free, "the debounced run")
    assert versions(broker, "d") == [50]
