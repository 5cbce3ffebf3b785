"""The Huey integration against real ``huey_consumer`` processes on the session's private redis-server."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from huey import crontab
from huey.api import Huey, Result, Task
from huey.exceptions import CancelExecution
from huey.storage import MemoryStorage

import uniqjob
import uniqjob.queues
from tests.conftest import FakeClock
from tests.huey_tasks import (
    connect,
    debounced,
    every_minute,
    existing,
    flaky,
    gate,
    huey,
    latest,
    latest_or_retry,
    one_at_a_time,
    replaced,
    rescheduled,
    strict,
)
from tests.integration_workers import NODE_VAR, URL_VAR, Workers, count, open_gate, wait_until, worker_pool
from tests.redis_server import RedisServer
from uniqjob import ConfigurationError, JobNotUnique, Parked, Pending
from uniqjob.integrations.huey import HueyQueue, UniqueHuey
from uniqjob.locks import LockState
from uniqjob.stores.memory import MemoryBackend

NAME = "tests.huey_tasks.gate"


@pytest.fixture
def huey_redis(
    redis_server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> redis.Redis:
    """The test Redis as Huey's storage and the lock store, flushed."""
    monkeypatch.setenv(URL_VAR, redis_server.url)
    uniqjob.configure(redis_server.url)
    connect(redis_server.url)
    return redis_client


@pytest.fixture
def consumers(huey_redis: redis.Redis, redis_server: RedisServer, tmp_path: Path) -> Iterator[Workers]:
    with worker_pool(redis_server.url, tmp_path) as pool:
        yield pool


def start_consumer(
    workers: Workers, name: str = "huey", *, periodic: bool = False, node: str = "", kind: str = "thread"
) -> None:
    """A plain ``huey_consumer`` of the test Huey, two workers (threads), no periodic tasks unless asked.

    ``node``: the consumer looks like one on another machine (see ``pretend_other_host``).
    """
    argv = [sys.executable, "-m", "huey.bin.huey_consumer", "tests.huey_tasks.huey", "-w", "2", "-k", kind]
    workers.start(name, argv if periodic else [*argv, "--no-periodic"], **({NODE_VAR: node} if node else {}))


def state(task: object, *args: object) -> LockState:
    return uniqjob.default_backend().read(task.unique_job.lock_key(*args))  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["thread", pytest.param("process", marks=pytest.mark.slow)])
def test_duplicates_while_a_task_is_queued_or_running_are_dropped_and_counted(
    consumers: Workers, huey_redis: redis.Redis, kind: str
) -> None:
    first = gate("a")
    assert isinstance(first, Result)
    queued = state(gate, "a")
    assert queued.queue is not None and queued.queue.state == "queued"
    assert queued.queue.meta.job_id == first.id  # the claim records Huey's task id
    (pending,) = huey.pending()
    assert pending.kwargs["uniqjob"] == {"key": gate.unique_job.lock_key("a"), "token": queued.queue.token}
    assert [gate("a") for _ in range(3)] == [None] * 3  # queued: dropped, nothing enqueued
    assert huey.pending_count() == 1

    start_consumer(consumers, kind=kind)
    wait_until(lambda: count(huey_redis, "started", "a") == 1, "the task to start")
    running = state(gate, "a")
    assert running.queue is not None and running.queue.state == "running"
    assert running.run is not None and running.run.holder.pid != os.getpid()  # held by the consumer
    assert [gate("a") for _ in range(2)] == [None] * 2  # running: dropped
    other = gate("b")  # another key is free
    assert isinstance(other, Result)

    open_gate(huey_redis, "a")
    open_gate(huey_redis, "b")
    assert first.get(blocking=True, timeout=20) == "a"  # the function got its arguments, not the lock's
    assert other.get(blocking=True, timeout=20) == "b"
    wait_until(lambda: not gate.unique_job.is_locked("a") and not gate.unique_job.is_locked("b"), "the locks")
    assert count(huey_redis, "started", "a") == count(huey_redis, "done", "a") == 1
    assert uniqjob.ops.duplicates(job_class=NAME) == {NAME: 5}  # `uniqjob stats` counts each drop
    assert isinstance(gate("a"), Result)  # done: free again


def test_a_killed_consumer_is_reclaimed_at_once_on_its_host(
    consumers: Workers, huey_redis: redis.Redis
) -> None:
    start_consumer(consumers, "first")
    gate("k")
    wait_until(lambda: count(huey_redis, "started", "k") == 1, "the task to start")
    assert gate("k") is None  # a live task is never robbed

    consumers.kill("first")  # SIGKILL, mid-task: Huey has lost the task, its lock's holder is dead
    again = gate("k")  # the holder's pid is gone: provably dead, reclaimed at once
    assert isinstance(again, Result)

    start_consumer(consumers, "second")
    open_gate(huey_redis, "k")
    assert again.get(blocking=True, timeout=20) == "k"
    wait_until(lambda: not gate.unique_job.is_locked("k"), "its lock to go")
    assert count(huey_redis, "started", "k") == 2  # the killed run, then the new one


# -- without a consumer -------------------------------------------------------------------


def test_misconfigured_tasks_are_configuration_errors_naming_the_setting() -> None:
    local = UniqueHuey("misconfigured", storage_class=MemoryStorage)

    def job(n: int) -> int:
        return n

    with pytest.raises(ConfigurationError, match="unique_on_conflit"):
        local.task(unique=True, unique_on_conflit="raise")(job)
    with pytest.raises(ConfigurationError, match=r"unique_on_conflict must be one of .*'shout'"):
        local.task(unique=True, unique_on_conflict="shout")(job)
    with pytest.raises(ConfigurationError, match="unique_lock_autoexpire but is not unique: add unique=True"):
        local.task(unique_lock_autoexpire=60)(job)
    with pytest.raises(ConfigurationError, match=r"periodic huey task .*'reschedule' would run a tick's dup"):
        local.periodic_task(crontab(), unique=True, unique_on_conflict="reschedule")(job)
    with pytest.raises(ConfigurationError, match="its queue is Huey's"):
        local.task(unique=True, unique_queue=None)(job)
    resultless = UniqueHuey("resultless", results=False, storage_class=MemoryStorage)
    with pytest.raises(ConfigurationError, match=r"'use_existing' gives .* this Huey keeps no results"):
        resultless.task(unique=True, unique_on_conflict="use_existing")(job)
    assert local.task(name="plain")(job).unique_job is None  # a plain task, as Huey makes it
    made = local.task(unique=True, unique_lock_autoexpire=60)(job)  # none registered by the failures
    assert made.unique_job.unique_lock_autoexpire == 60


def test_policies_raise_and_reschedule(huey_redis: redis.Redis) -> None:
    assert isinstance(strict("x"), Result)
    with pytest.raises(JobNotUnique) as raised:
        strict("x")
    assert raised.value.key == strict.unique_job.lock_key("x")
    assert huey.pending_count() == 1

    assert isinstance(rescheduled("s"), Result)
    assert rescheduled("s") is None  # rescheduled: a task due a second from now, holding no lock yet
    _, first, later = huey.pending()
    assert "uniqjob" in first.kwargs and "uniqjob" not in later.kwargs and later.args == ("s",)
    assert later.eta is not None and later.eta > datetime.now(UTC).replace(tzinfo=None)


def test_a_scheduled_task_s_lock_outlives_its_wait(huey_redis: redis.Redis) -> None:
    later = gate.schedule(("later",), delay=3000)
    assert isinstance(later, Result)
    held = state(gate, "later").queue
    assert held is not None and held.meta.job_id == later.id
    assert 3590 < held.ttl <= 3600  # type: ignore[operator]  # unique_lock_autoexpire (600) + the delay
    assert gate.schedule(("later",), delay=10) is None


def test_immediate_mode_runs_the_task_under_its_lock_in_place() -> None:
    """Huey's immediate mode (no consumer): enqueue runs the task at once, locked, and releases it."""
    local = UniqueHuey("immediate", immediate=True)
    seen: list[bool] = []

    @local.task(unique=True, unique_backend=MemoryBackend(), retries=1)  # type: ignore[untyped-decorator]
    def once(n: int) -> int:
        seen.append(once.unique_job.is_locked(n))
        if len(seen) == 1:
            raise RuntimeError("the first attempt fails; Huey retries it at once")
        return n

    assert once(3)() == 3
    assert seen == [True, True] and not once.unique_job.is_locked(3)

    @local.task(unique=True, unique_backend=MemoryBackend())  # type: ignore[untyped-decorator]
    def add(a: int, b: int = 0) -> int:
        seen.append(add.unique_job.is_locked(a, b))
        return a + b

    # a pipeline: each step is enqueued through its lock, the next as the one before completes
    assert local.enqueue(add.s(1, 2).then(add, 10)).get() == [3, 13]
    assert seen[2:] == [True, True] and not add.unique_job.is_locked(10, 3)


def test_a_task_cancelled_before_it_runs_frees_its_lock() -> None:
    """A pre-execute hook's CancelExecution: Huey drops the task unrun, and says so by a signal."""
    local = UniqueHuey("cancelling", immediate=True)
    ran: list[int] = []

    @local.task(unique=True, unique_backend=MemoryBackend())  # type: ignore[untyped-decorator]
    def guarded(n: int) -> None:
        ran.append(n)

    @local.pre_execute()  # type: ignore[untyped-decorator]
    def refuse_odd(task: Task) -> None:
        if task.args[0] % 2:
            raise CancelExecution()

    guarded(1)
    guarded(2)
    assert ran == [2]
    assert not guarded.unique_job.is_locked(1) and not guarded.unique_job.is_locked(2)
    # Enqueued around UniqueHuey (Huey's own enqueue): the task comes back through its lock, then runs.
    Huey.enqueue(local, guarded.s(4))
    assert ran == [2, 4] and not guarded.unique_job.is_locked(4)


@pytest.fixture
def aging(huey_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    """Huey on the test Redis, the locks in memory on a clock the test moves (no sleeping)."""
    clock = FakeClock()
    uniqjob.configure(MemoryBackend(clock=clock))
    monkeypatch.setattr(uniqjob.queues, "_clock", clock)
    yield clock
    uniqjob.configure(None)


@pytest.mark.parametrize("how", ["revoke", "revoke once", "revoke until later"])
def test_a_revoked_task_frees_its_lock_at_the_next_enqueue(aging: FakeClock, how: str) -> None:
    first = gate("r")
    assert isinstance(first, Result)
    queue = gate.unique_job.unique_queue
    assert isinstance(queue, HueyQueue) and queue.suspect_after == 60
    if how == "revoke until later":
        huey.revoke_by_id(first.id, revoke_until=datetime(2100, 1, 1))
    else:
        huey.revoke_by_id(first.id, revoke_once=how == "revoke once")
    aging.advance(59)
    assert gate("r") is None  # young: Huey not asked
    aging.advance(1)
    again = gate("r")
    if how == "revoke until later":  # it may still run then: when in doubt, the lock stays
        assert again is None and not queue.job_gone(first.id)
        return
    assert isinstance(again, Result) and again.id != first.id
    assert state(gate, "r").queue.meta.job_id == again.id  # type: ignore[union-attr]


# -- slow: retries, drops, crashes elsewhere, periodic ticks ---------------------------------------


def waiting_for_retry(task: object, *args: object) -> bool:
    now = state(task, *args)
    return now.queue is not None and now.queue.state == "queued" and now.run is None


@pytest.mark.slow
@pytest.mark.parametrize("failures", [1, -1], ids=["error", "RetryTask"])
def test_retries_keep_the_lock_until_the_last_attempt(
    consumers: Workers, huey_redis: redis.Redis, failures: int
) -> None:
    start_consumer(consumers)
    flaky("f", failures)
    wait_until(lambda: count(huey_redis, "started", "f") == 1, "attempt 1")
    token = state(flaky, "f", failures).queue.token  # type: ignore[union-attr]
    open_gate(huey_redis, "f:1")  # attempt 1 fails; Huey retries it a second later
    wait_until(lambda: waiting_for_retry(flaky, "f", failures), "the lock to wait, queued, for the retry")
    assert state(flaky, "f", failures).queue.token == token  # type: ignore[union-attr]
    assert flaky("f", failures) is None  # still unique while the retry waits
    wait_until(lambda: count(huey_redis, "started", "f") == 2, "attempt 2")
    assert flaky("f", failures) is None
    open_gate(huey_redis, "f:2")
    wait_until(lambda: count(huey_redis, "done", "f") == 1, "attempt 2 to succeed")
    wait_until(lambda: not flaky.unique_job.is_locked("f", failures), "the lock to go after the last attempt")


@pytest.mark.slow
def test_a_task_that_fails_for_good_releases_its_lock(consumers: Workers, huey_redis: redis.Redis) -> None:
    start_consumer(consumers)
    for attempt in (1, 2, 3):
        open_gate(huey_redis, f"d:{attempt}")
    flaky("d", 99)
    wait_until(lambda: count(huey_redis, "started", "d") == 3, "the first try and both retries")
    wait_until(lambda: not flaky.unique_job.is_locked("d", 99), "its lock to go")
    assert isinstance(flaky("d", 99), Result)


@pytest.mark.slow
def test_revoked_and_expired_tasks_free_their_locks_on_the_consumer(
    consumers: Workers, huey_redis: redis.Redis
) -> None:
    revoked = gate("v")
    revoked.revoke()
    gate.schedule(("x",), expires=0.5, delay=0)  # expires before a consumer sees it
    time.sleep(1)
    assert gate("v") is None and gate("x") is None  # held until a consumer meets them
    start_consumer(consumers)
    wait_until(lambda: not gate.unique_job.is_locked("v") and not gate.unique_job.is_locked("x"), "the locks")
    assert count(huey_redis, "started", "v") == count(huey_redis, "started", "x") == 0


@pytest.mark.slow
def test_a_killed_consumer_elsewhere_is_reclaimed_within_one_lease(
    consumers: Workers, huey_redis: redis.Redis
) -> None:
    start_consumer(consumers, "remote", node="another-machine")
    gate("r")
    wait_until(lambda: count(huey_redis, "started", "r") == 1, "the task to start")
    time.sleep(gate.unique_job.unique_run_lease * 1.5)  # alive across leases: its heartbeat keeps the lock
    assert gate("r") is None
    consumers.kill("remote")
    assert gate("r") is None  # another machine's pid cannot be checked: wait for the lease
    wait_until(lambda: gate("r") is not None, "the lease to lapse", timeout=10)


@pytest.mark.slow
def test_reschedule_goes_through_hueys_schedule(consumers: Workers, huey_redis: redis.Redis) -> None:
    start_consumer(consumers)
    rescheduled("s")
    wait_until(lambda: count(huey_redis, "started", "s") == 1, "the first run")
    assert rescheduled("s") is None  # held: tried again a second later, through Huey's schedule
    name = rescheduled.unique_job.job_name()
    wait_until(lambda: uniqjob.ops.duplicates(job_class=name)[name] >= 2, "a try while still held")
    assert count(huey_redis, "started", "s") == 1  # rescheduled again, not run
    open_gate(huey_redis, "s")
    wait_until(lambda: count(huey_redis, "done", "s") == 2, "the rescheduled call to run")
    wait_until(lambda: not rescheduled.unique_job.is_locked("s"), "its lock to go")


@pytest.mark.slow
def test_a_periodic_task_on_two_consumers_runs_once_per_tick(
    consumers: Workers, huey_redis: redis.Redis
) -> None:
    # Each consumer's scheduler enqueues the periodic task as it starts, then once a minute:
    # start both well inside one minute, so that both enqueue in it.
    second = datetime.now().second
    if second > 40:
        time.sleep(61 - second)
    for host in ("one", "two"):
        start_consumer(consumers, host, periodic=True, node=host)
    name = every_minute.unique_job.job_name()
    wait_until(lambda: uniqjob.ops.duplicates(job_class=name) == {name: 1}, "the second scheduler's enqueue")
    wait_until(lambda: count(huey_redis, "done", "tick") == 1, "the tick's run")
    assert count(huey_redis, "started", "tick") == 1
    assert "Enqueueing periodic task" in consumers.log("one") + consumers.log("two")


@pytest.mark.slow
def test_block_parks_and_a_promotion_enqueues_into_huey(consumers: Workers, huey_redis: redis.Redis) -> None:
    start_consumer(consumers)
    assert isinstance(one_at_a_time("p1"), Result)
    wait_until(lambda: count(huey_redis, "started", "p1") == 1, "the first task to start")
    parked = one_at_a_time("p2")
    assert isinstance(parked, Parked)  # parked, not in Huey yet
    assert huey.pending_count() == 0 and one_at_a_time.unique_job.is_locked("p2")
    open_gate(huey_redis, "p1")
    wait_until(lambda: count(huey_redis, "started", "p2") == 1, "the parked task to be enqueued and run")
    assert count(huey_redis, "done", "p1") == 1  # only once the first gave up its slot
    open_gate(huey_redis, "p2")
    wait_until(lambda: not one_at_a_time.unique_job.is_locked("p2"), "its lock to go")


# -- the conflict policies: use_existing, keep_last, replace, debounce (docs/huey.md) ---------------


def test_keep_last_in_immediate_mode_runs_the_last_call_and_a_context_task_gets_its_task() -> None:
    local = UniqueHuey("coalescing", immediate=True)
    seen: list[tuple[int, str]] = []

    @local.task(  # type: ignore[untyped-decorator]
        unique=True,
        unique_backend=MemoryBackend(),
        unique_on_conflict="keep_last",
        unique_args=("n",),
        context=True,
    )
    def sync(n: int, revision: int, task: Task | None = None) -> None:
        assert task is not None
        seen.append((revision, task.id))
        if revision == 1:  # three more calls while this one runs: the last one runs next
            assert isinstance(sync(n, 2), Pending)
            sync(n, 3)
            sync(n, 4)

    sync(7, 1)
    assert [revision for revision, _ in seen] == [1, 4] and seen[0][1] != seen[1][1]
    assert not sync.unique_job.is_locked(7, 0)


def versions(r: redis.Redis, name: str) -> list[int]:
    return [int(v) for v in r.lrange(f"versions:{name}", 0, -1)]


@pytest.mark.slow
def test_keep_last_runs_the_queued_task_with_the_last_call_and_50_calls_while_running_once_more(
    consumers: Workers, huey_redis: redis.Redis
) -> None:
    queued = latest("q", 0)
    assert isinstance(queued, Result)
    assert {latest("q", v).id for v in range(1, 11)} == {queued.id}  # each: the queued task's Result
    assert huey.pending_count() == 1
    open_gate(huey_redis, "q")
    start_consumer(consumers)
    assert queued.get(blocking=True, timeout=20, preserve=True) == 10
    assert versions(huey_redis, "q") == [10]

    first = latest("a", 0)
    wait_until(lambda: count(huey_redis, "started", "a") == 1, "the first run to start")
    triggers = [latest("a", v) for v in range(1, 51)]
    assert all(isinstance(t, Pending) for t in triggers)
    open_gate(huey_redis, "a")  # stays open: the next run passes too
    assert first.get(blocking=True, timeout=20) == 0
    wait_until(lambda: count(huey_redis, "done", "a") == 2, "the pending run")
    wait_until(lambda: state(latest, "a", 0).free, "the lock to go")
    assert versions(huey_redis, "a") == [0, 50]


@pytest.mark.slow
def test_a_call_waiting_behind_a_revoked_retry_is_enqueued(
    consumers: Workers, huey_redis: redis.Redis
) -> None:
    start_consumer(consumers)
    first = latest_or_retry("w", 0)
    wait_until(lambda: count(huey_redis, "started", "w") == 1, "the first attempt to start")
    assert isinstance(latest_or_retry("w", 1), Pending)
    open_gate(huey_redis, "w")  # the attempt fails: its retry waits two seconds
    wait_until(lambda: waiting_for_retry(latest_or_retry, "w", 0), "the retry to wait")
    first.revoke()  # the retry: skipped when it comes up
    wait_until(lambda: count(huey_redis, "done", "w") == 2, "the waiting call to run")
    wait_until(lambda: state(latest_or_retry, "w", 0).free, "the lock to go")
    assert versions(huey_redis, "w") == [0, 1]


@pytest.mark.slow
def test_replace_revokes_the_queued_task_which_never_runs(
    consumers: Workers, huey_redis: redis.Redis
) -> None:
    old = replaced("r", 0)
    new = replaced("r", 1)
    assert isinstance(old, Result) and isinstance(new, Result) and old.id != new.id
    assert huey.is_revoked(old.id) and state(replaced, "r", 0).queue.meta.job_id == new.id  # type: ignore[union-attr]
    open_gate(huey_redis, "r")
    start_consumer(consumers)
    assert new.get(blocking=True, timeout=20) == 1
    wait_until(lambda: state(replaced, "r", 0).free and huey.pending_count() == 0, "the queue to drain")
    assert versions(huey_redis, "r") == [1]  # the revoked task never ran, and freed nothing of the new one's


@pytest.mark.slow
def test_50_calls_in_a_debounced_burst_run_once_with_the_last(
    consumers: Workers, huey_redis: redis.Redis
) -> None:
    start_consumer(consumers)
    handles = [debounced("d", v) for v in range(1, 51)]
    assert isinstance(handles[0], Result) and {h.id for h in handles} == {handles[0].id}
    queued = state(debounced, "d", 0).queue
    assert queued is not None and queued.due is not None and queued.meta.args == "'d', 50"
    wait_until(lambda: count(huey_redis, "done", "d") == 1, "the debounced run")
    wait_until(lambda: state(debounced, "d", 0).free and huey.scheduled_count() == 0, "nothing left to run")
    assert versions(huey_redis, "d") == [50]


@pytest.mark.slow
def test_use_existing_results_resolve_to_the_first_tasks(consumers: Workers, huey_redis: redis.Redis) -> None:
    first = existing("u")
    queued = existing("u")  # while queued
    start_consumer(consumers)
    wait_until(lambda: count(huey_redis, "started", "u") == 1, "the task to start")
    running = existing("u")  # while running
    assert isinstance(queued, Result) and isinstance(running, Result)
    assert queued.id == running.id == first.id
    open_gate(huey_redis, "u")
    assert running.get(blocking=True, timeout=20, preserve=True) == "u"
    assert queued.get(blocking=True, timeout=20, preserve=True) == first.get(preserve=True) == "u"
    assert count(huey_redis, "started", "u") == 1
