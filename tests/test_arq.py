"""The arq integration against real ``arq`` worker processes and the session's private redis-server."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

# arq 0.28 asks for redis<6 while celery asks for redis>=6.1: `pip install --no-deps arq` (as .ci/run does).
pytest.importorskip("arq", reason="arq is not installed: pip install --no-deps 'arq>=0.28'")

from arq.jobs import Job, JobStatus

import uniqjob
import uniqjob.queues
from tests.arq_jobs import (
    Debounced,
    Expiring,
    Failing,
    Flaky,
    Gate,
    Latest,
    Limited,
    LimitedDiscard,
    LimitedFlaky,
    LimitedRaise,
    Replaced,
    Rescheduled,
    queue,
)
from tests.conftest import FakeClock
from tests.integration_workers import NODE_VAR, URL_VAR, Workers, count, open_gate, wait_until, worker_pool
from tests.redis_server import RedisServer
from uniqjob import ConcurrencyLimitExceeded, ConfigurationError, Pending, UniqueJob
from uniqjob.concurrency import Parked
from uniqjob.integrations import Ticket
from uniqjob.integrations.arq import ArqQueue, decide, run_job
from uniqjob.locks import LockState
from uniqjob.stores.memory import MemoryBackend

T = TypeVar("T")


def run(call: Awaitable[T]) -> T:
    async def main() -> T:
        return await call

    return asyncio.run(main())


@pytest.fixture
def workers(
    redis_server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Workers]:
    monkeypatch.setenv(URL_VAR, redis_server.url)
    uniqjob.configure(redis_server.url)
    with worker_pool(redis_server.url, tmp_path) as pool:
        yield pool


def start_worker(workers: Workers, name: str = "arq", **env: str) -> None:
    """A plain ``arq`` worker process on the test queue."""
    arq = str(Path(sys.executable).with_name("arq"))
    workers.start(name, [arq, "tests.arq_jobs.WorkerSettings"], **env)


def state(job_cls: type[UniqueJob], *args: object) -> LockState:
    return uniqjob.default_backend().read(job_cls.lock_key(*args))


def enqueue(job_cls: type[UniqueJob], *args: object) -> Any:
    return run(job_cls.aenqueue(*args))


def status(job: Job | str) -> JobStatus:
    """arq's status of ``job`` (or of the job of that id)."""
    job_id = job if isinstance(job, str) else job.job_id

    async def main() -> JobStatus:
        return await Job(job_id, await queue.pool(), _queue_name=queue.queue_name or "").status()

    return asyncio.run(main())


def test_duplicates_while_queued_or_running_are_dropped(workers: Workers, redis_client: redis.Redis) -> None:
    job = enqueue(Gate, "a")
    assert isinstance(job, Job)
    queued = state(Gate, "a")
    assert queued.queue is not None and queued.queue.state == "queued"
    assert queued.queue.meta.job_id == job.job_id  # the queue lock records the arq job id
    assert [enqueue(Gate, "a") for _ in range(5)] == [None] * 5  # dropped while queued

    start_worker(workers)
    wait_until(lambda: count(redis_client, "started", "a") == 1, "the job to start")
    running = state(Gate, "a")
    assert running.queue is not None and running.queue.state == "running"
    assert running.run is not None and running.run.holder.pid != os.getpid()  # held by the worker
    assert [enqueue(Gate, "a") for _ in range(5)] == [None] * 5  # dropped while running
    assert enqueue(Gate, "b") is not None  # another key is free

    open_gate(redis_client, "a")
    open_gate(redis_client, "b")
    wait_until(lambda: not Gate.is_locked("a") and not Gate.is_locked("b"), "both locks to go")
    assert count(redis_client, "started", "a") == count(redis_client, "done", "a") == 1
    wait_until(lambda: status(job) == JobStatus.complete, "arq to record the result")


def test_retries_keep_the_lock_until_the_job_is_done(workers: Workers, redis_client: redis.Redis) -> None:
    start_worker(workers)
    enqueue(Flaky, "f", 1)
    wait_until(lambda: count(redis_client, "started", "f") == 1, "attempt 1")
    open_gate(redis_client, "f:1")  # attempt 1 raises Retry
    wait_until(lambda: count(redis_client, "started", "f") == 2, "attempt 2")
    assert enqueue(Flaky, "f", 1) is None  # the retry holds the key
    open_gate(redis_client, "f:2")
    wait_until(lambda: count(redis_client, "done", "f") == 1, "attempt 2 to finish")
    wait_until(lambda: not Flaky.is_locked("f", 1), "the lock to go")


@pytest.mark.slow
def test_between_retries_the_lock_is_queued_and_duplicates_drop(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers)
    enqueue(Flaky, "w", 2)
    wait_until(lambda: count(redis_client, "started", "w") == 1, "attempt 1")
    open_gate(redis_client, "w:1")
    wait_until(lambda: count(redis_client, "started", "w") == 2, "attempt 2")
    # attempt 2 waits at its gate, holding the run lock; the retry kept the key all along
    held = state(Flaky, "w", 2)
    assert held.queue is not None and held.queue.state == "running"
    assert enqueue(Flaky, "w", 2) is None
    open_gate(redis_client, "w:2")
    wait_until(lambda: count(redis_client, "started", "w") == 3, "attempt 3")
    open_gate(redis_client, "w:3")
    wait_until(lambda: not Flaky.is_locked("w", 2), "the lock to go")
    assert count(redis_client, "done", "w") == 1


@pytest.mark.slow
def test_a_job_out_of_tries_frees_its_lock_at_the_next_enqueue(
    workers: Workers, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # asked at once: the threshold itself is the fake-clock test's (test_a_young_lock...)
    monkeypatch.setattr(queue, "suspect_after", 0.0)
    start_worker(workers)  # max_tries = 3: a fourth try is dropped by arq without running
    first = enqueue(Flaky, "x", 9)
    for attempt in (1, 2, 3):
        wait_until(lambda: count(redis_client, "started", "x") == attempt, f"attempt {attempt}")  # noqa: B023
        open_gate(redis_client, f"x:{attempt}")
    wait_until(lambda: status(first) == JobStatus.complete, "arq to drop the job")
    assert state(Flaky, "x", 9).queue is not None  # nothing ran to free it...
    second = enqueue(Flaky, "x", 9)  # ...but arq has finished with the job: the lock is reclaimed
    assert isinstance(second, Job) and second.job_id != first.job_id


def test_a_job_that_fails_for_good_releases_its_lock(workers: Workers, redis_client: redis.Redis) -> None:
    start_worker(workers)
    enqueue(Failing, "e")
    wait_until(lambda: count(redis_client, "started", "e") == 1, "the job to run")
    wait_until(lambda: not Failing.is_locked("e"), "the lock to go")


@pytest.mark.slow
def test_an_expired_job_frees_its_lock_at_the_next_enqueue(
    workers: Workers, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Expiring.unique_queue, "suspect_after", 0.0)  # as above
    first = enqueue(Expiring, "late")
    assert enqueue(Expiring, "late") is None
    wait_until(lambda: not redis_client.exists(f"arq:job:{first.job_id}"), "arq's job to expire", timeout=10)
    assert status(first) == JobStatus.queued  # still in arq's queue, to be dropped when it comes up
    # The worker is up before the new job is enqueued: it, too, expires a second after (a worker
    # started after it, on a loaded machine, found it expired as well).
    # Until the worker has dropped the first job, arq marks it in progress (its in-progress key,
    # set as the worker takes it up): not provably gone, so the next call was a duplicate (CI, once).
    start_worker(workers)
    done = (JobStatus.complete, JobStatus.not_found)
    wait_until(lambda: status(first) in done, "the worker to drop the first job")
    second = enqueue(Expiring, "late")  # arq will never run the first: its lock is reclaimed
    assert isinstance(second, Job)
    wait_until(lambda: count(redis_client, "started", "late") == 1, "the new job to run")
    wait_until(lambda: not Expiring.is_locked("late"), "its lock to go")


def test_a_killed_workers_lock_is_reclaimed(workers: Workers, redis_client: redis.Redis) -> None:
    start_worker(workers, "first")
    enqueue(Gate, "k")
    wait_until(lambda: count(redis_client, "started", "k") == 1, "the job to start")
    assert enqueue(Gate, "k") is None  # a live job is never robbed
    workers.kill("first")
    second = enqueue(Gate, "k")  # the worker's pid is gone: provably dead, reclaimed at once
    assert isinstance(second, Job)
    start_worker(workers, "second")
    wait_until(lambda: count(redis_client, "started", "k") >= 2, "the new job to start")
    open_gate(redis_client, "k")
    wait_until(lambda: not Gate.is_locked("k"), "its lock to go")


@pytest.mark.slow
def test_a_killed_worker_elsewhere_is_reclaimed_within_one_lease(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers, "remote", **{NODE_VAR: "another-machine"})
    enqueue(Gate, "r")
    wait_until(lambda: count(redis_client, "started", "r") == 1, "the job to start")
    workers.kill("remote")
    assert enqueue(Gate, "r") is None  # another machine's pid cannot be checked: wait for the lease
    waited = wait_until(lambda: enqueue(Gate, "r") is not None, "the lease to lapse", timeout=10)
    assert waited <= Gate.unique_run_lease + 1.0


def test_reschedule_goes_through_arq(workers: Workers, redis_client: redis.Redis) -> None:
    start_worker(workers)
    enqueue(Rescheduled, "s")
    wait_until(lambda: count(redis_client, "started", "s") == 1, "the first run")
    assert enqueue(Rescheduled, "s") is None  # the duplicate comes back through arq...
    open_gate(redis_client, "s:1")
    wait_until(lambda: count(redis_client, "started", "s") == 2, "the rescheduled run")  # ...and runs
    open_gate(redis_client, "s:2")
    wait_until(lambda: not Rescheduled.is_locked("s"), "its lock to go")


# -- concurrency limits through arq's queue ---------------------------------------------------


def peaks(r: redis.Redis, group: str) -> list[int]:
    """How many jobs of ``group`` ran at once, as each of them started."""
    return [int(n) for n in r.lrange(f"peaks:{group}", 0, -1)]


def test_block_parks_over_the_limit_and_a_worker_runs_it_when_a_slot_frees(
    workers: Workers, redis_client: redis.Redis
) -> None:
    first = enqueue(Limited, "g", "a")
    assert isinstance(first, Job)
    parked = [enqueue(Limited, "g", name) for name in ("b", "c")]
    assert all(isinstance(p, Parked) for p in parked)  # in no arq queue yet: parked in the store
    assert [p.position for p in parked] == [1, 2]
    assert enqueue(Limited, "g", "b") is None  # a duplicate of a parked call is dropped too
    assert isinstance(enqueue(Limited, "other", "x"), Job)  # another concurrency key is free
    start_worker(workers, "one")
    start_worker(workers, "two")  # two workers: only the limit keeps them to one job of "g" at a time
    for name, after in (("a", "b"), ("b", "c")):
        wait_until(lambda: count(redis_client, "started", name) == 1, f"{name} to start")  # noqa: B023
        assert count(redis_client, "started", after) == 0  # parked: never beside the limit
        open_gate(redis_client, name)  # its end promotes the next, pushed to arq by the worker
    wait_until(lambda: count(redis_client, "started", "c") == 1, "c to start")
    open_gate(redis_client, "c")
    open_gate(redis_client, "x")
    wait_until(lambda: count(redis_client, "done", "c") == 1, "c to finish")
    assert peaks(redis_client, "g") == [1, 1, 1]
    assert [count(redis_client, "started", name) for name in "abc"] == [1, 1, 1]  # none lost, none twice
    wait_until(lambda: Limited.semaphore("g", "").read().empty, "the slots to go")
    wait_until(lambda: not any(Limited.is_locked("g", n) for n in "abc"), "the locks to go")


def test_a_retry_keeps_its_slot_and_the_parked_call_waits_for_its_end(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers)
    assert isinstance(enqueue(LimitedFlaky, "t", "f"), Job)
    wait_until(lambda: count(redis_client, "started", "f") == 1, "attempt 1")
    assert isinstance(enqueue(LimitedFlaky, "t", "n"), Parked)
    open_gate(redis_client, "f:1")  # attempt 1 raises Retry: the slot is kept, reserved, for attempt 2
    wait_until(lambda: count(redis_client, "started", "f") == 2, "attempt 2")
    assert count(redis_client, "started", "n") == 0  # the key's one slot is still the retry's
    open_gate(redis_client, "f:2")
    wait_until(lambda: count(redis_client, "started", "n") == 1, "the parked call to run")
    open_gate(redis_client, "n:1")  # its own first attempt asks for a retry too
    open_gate(redis_client, "n:2")
    wait_until(lambda: count(redis_client, "done", "n") == 1, "it to finish")
    wait_until(lambda: LimitedFlaky.semaphore("t", "").read().empty, "the slots to go")


def test_raise_and_discard_refuse_a_call_over_the_limit_at_enqueue(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(URL_VAR, redis_server.url)
    uniqjob.configure(redis_server.url)
    assert isinstance(enqueue(LimitedRaise, "r", "a"), Job)  # its slot is taken at enqueue
    with pytest.raises(ConcurrencyLimitExceeded):
        enqueue(LimitedRaise, "r", "b")
    assert not LimitedRaise.is_locked("r", "b")
    assert isinstance(enqueue(LimitedDiscard, "d", "a"), Job)
    assert enqueue(LimitedDiscard, "d", "b") is None
    assert not LimitedDiscard.is_locked("d", "b")


def test_a_killed_workers_slot_is_reclaimed_and_the_parked_call_runs(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers, "first")
    enqueue(Limited, "k", "a")
    wait_until(lambda: count(redis_client, "started", "a") == 1, "a to start")
    assert isinstance(enqueue(Limited, "k", "b"), Parked)
    workers.kill("first")  # SIGKILL: its slot stays running, held by a pid that is gone
    redis_client.delete("running:k")  # a's count of running jobs, which its end never took back
    # c parks behind b, finds the holder provably dead, and its slot goes to b (pushed to arq)
    assert isinstance(enqueue(Limited, "k", "c"), Parked)
    (slot,) = Limited.semaphore("k", "").read().slots
    assert slot.status == "reserved" and Limited.semaphore("k", "").read().parked == 1  # b's; c waits
    start_worker(workers, "second")
    wait_until(lambda: count(redis_client, "started", "b") == 1, "b, promoted, to start")
    assert count(redis_client, "started", "c") == 0
    open_gate(redis_client, "b")
    wait_until(lambda: count(redis_client, "started", "c") == 1, "c to start")
    open_gate(redis_client, "c")
    open_gate(redis_client, "a")  # arq may run a again (its worker died mid-job): let it end
    wait_until(lambda: count(redis_client, "done", "c") == 1, "c to finish")
    assert peaks(redis_client, "k") == [1, 1, 1]  # a, then b and c: one at a time


# -- without a worker -------------------------------------------------------------------------


def test_the_sync_enqueue_is_refused_and_leaves_no_lock(redis_server: RedisServer, monkeypatch: Any) -> None:
    monkeypatch.setenv(URL_VAR, redis_server.url)
    uniqjob.configure(redis_server.url)
    with pytest.raises(ConfigurationError, match=r"ArqQueue\.push is async"):
        Gate.enqueue("sync")
    assert not Gate.is_locked("sync")


def test_bad_queue_settings_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="ArqQueue needs arq RedisSettings"):
        ArqQueue("redis://x")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="expires must be a number of seconds"):
        ArqQueue(lambda: None, expires=0)  # type: ignore[arg-type, return-value]
    with pytest.raises(ConfigurationError, match="not RedisSettings or ArqRedis"):
        run(ArqQueue(lambda: "nope").pool())  # type: ignore[arg-type, return-value]


def test_run_job_without_lock_data_says_so() -> None:
    with pytest.raises(ConfigurationError, match="arq job j1 carries no uniqjob lock data"):
        run(run_job({"job_id": "j1"}, {}, [], {}))
    with pytest.raises(ConfigurationError, match="malformed"):
        run(run_job({"job_id": "j2"}, {"uniqjob": {"key": ""}}, [], {}))
    assert Ticket("k", "t").dump() == {"key": "k", "token": "t"}


def test_decide_follows_arqs_own_rules() -> None:
    from arq import Retry

    assert decide(Retry(defer=2), None) == 2.0
    assert decide(Retry(), None) == 0.0
    assert decide(asyncio.CancelledError(), None) == 0.0  # a worker shutting down runs it again
    assert decide(RuntimeError("x"), None) is None and decide(None, 1) is None


def test_a_young_lock_s_lost_job_is_reclaimed_once_the_lock_is_old_enough(
    redis_server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job id is recorded by the claim; arq is asked about it only past suspect_after (fake clock)."""
    monkeypatch.setenv(URL_VAR, redis_server.url)
    clock = FakeClock()
    uniqjob.configure(MemoryBackend(clock=clock))
    monkeypatch.setattr(uniqjob.queues, "_clock", clock)
    asked: list[str] = []
    job_gone = ArqQueue.job_gone

    async def spy(self: ArqQueue, job_id: str) -> bool:
        asked.append(job_id)
        return await job_gone(self, job_id)

    monkeypatch.setattr(ArqQueue, "job_gone", spy)
    try:
        first = enqueue(Gate, "lost")
        assert isinstance(first, Job)
        assert state(Gate, "lost").queue.meta.job_id == first.job_id  # type: ignore[union-attr]
        redis_client.delete(f"arq:job:{first.job_id}")  # arq lost it
        assert enqueue(Gate, "lost") is None and asked == []  # young: one round trip, arq not asked
        assert queue.suspect_after is not None
        clock.advance(queue.suspect_after)
        second = enqueue(Gate, "lost")
        assert asked == [first.job_id]
        assert isinstance(second, Job) and second.job_id != first.job_id
    finally:
        uniqjob.configure(None)


# -- coalescing: keep_last, replace and debounce (docs/strategies.md) -----------------------------


def versions(r: redis.Redis, name: str) -> list[int]:
    return [int(v) for v in r.lrange(f"versions:{name}", 0, -1)]


def burst(job_cls: type[UniqueJob], name: str, first: int, last: int) -> list[Any]:
    """``await job_cls.aenqueue(name, v)`` for each version, in one event loop."""

    async def main() -> list[Any]:
        return [await job_cls.aenqueue(name, v) for v in range(first, last + 1)]

    return run(main())


@pytest.mark.slow
def test_keep_last_runs_once_more_with_the_last_of_50_triggers(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers)
    assert isinstance(burst(Latest, "a", 0, 0)[0], Job)
    wait_until(lambda: count(redis_client, "started", "a") == 1, "the first run to start")
    assert all(isinstance(p, Pending) for p in burst(Latest, "a", 1, 50))
    open_gate(redis_client, "a")
    wait_until(lambda: count(redis_client, "done", "a") == 2 and state(Latest, "a", 0).free, "the next run")
    assert versions(redis_client, "a") == [0, 50]


@pytest.mark.slow
def test_a_pending_call_behind_a_killed_worker_is_pushed_by_the_reap(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers, "doomed", **{NODE_VAR: "elsewhere"})  # only its lease can tell it died
    enqueue(Latest, "k", 0)
    wait_until(lambda: count(redis_client, "started", "k") == 1, "the first run to start")
    assert isinstance(enqueue(Latest, "k", 1), Pending)
    workers.kill("doomed")
    wait_until(lambda: state(Latest, "k", 0).run is None, "the dead run's lease to lapse")
    reaped = uniqjob.ops.reap()  # sync: arq's push is awaited on the library's background loop
    assert [row.key for row in reaped.reclaimed] == [Latest.lock_key("k", 0)]
    queued = state(Latest, "k", 0).queue
    assert queued is not None and queued.state == "queued" and queued.meta.args == "'k', 1"
    assert status(queued.meta.job_id) == JobStatus.queued
    open_gate(redis_client, "k")
    start_worker(workers)
    done = lambda: count(redis_client, "done", "k") == 1 and state(Latest, "k", 0).free  # noqa: E731
    wait_until(done, "the pending run")
    assert versions(redis_client, "k") == [0, 1]


@pytest.mark.slow
def test_replace_never_runs_the_replaced_job(workers: Workers, redis_client: redis.Redis) -> None:
    handles = burst(Replaced, "r", 0, 3)
    assert len({h.job_id for h in handles}) == 4
    open_gate(redis_client, "r")
    start_worker(workers)  # a worker without allow_abort_jobs: the aborted jobs come, and are refused
    wait_until(lambda: count(redis_client, "done", "r") == 1 and state(Replaced, "r", 0).free, "the run")
    assert versions(redis_client, "r") == [3]


@pytest.mark.slow
def test_a_debounced_burst_of_50_runs_once_with_the_last(workers: Workers, redis_client: redis.Redis) -> None:
    start_worker(workers)
    handles = burst(Debounced, "d", 1, 50)
    assert {h.job_id for h in handles} == {handles[0].job_id}
    open_gate(redis_client, "d")
    wait_until(lambda: count(redis_client, "done", "d") == 1 and state(Debounced, "d", 0).free, "the run")
    assert versions(redis_client, "d") == [50]
