"""The asyncio API: arun / aenqueue / ais_locked, ``async with Job.lock()``, async perform, on every store."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest
import redis

from tests.redis_server import RedisServer
from tests.support import StallFirst, own, route
from uniqjob import (
    BackendError,
    ConfigurationError,
    JobLock,
    JobNotUnique,
    MemoryBackend,
    UniqueJob,
    current_lock,
    unique,
)
from uniqjob.heartbeat import heartbeat
from uniqjob.stores.aio import DirectAsync, ThreadAsync, async_backend
from uniqjob.stores.base import Backend
from uniqjob.stores.file import FileBackend
from uniqjob.stores.redis import RedisBackend
from uniqjob.stores.redis._async import RedisAsync

T = TypeVar("T")


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine

    return asyncio.run(main())


def job_on(backend: Backend, **settings: Any) -> Any:
    """A job class on ``backend`` whose async perform waits for its gate and records its fence."""

    class Fetch(UniqueJob):
        unique_backend = backend
        gate: asyncio.Event | None = None
        lost: bool | None = None
        fences: ClassVar[list[int | None]] = []

        @classmethod
        async def perform(cls, item: int) -> str:
            lock = current_lock()
            cls.fences.append(None if lock is None else lock.fence)
            if cls.gate is not None:
                await cls.gate.wait()
            cls.lost = None if lock is None else lock.lost
            return f"fetched {item}"

    for name, value in settings.items():
        setattr(Fetch, name, value)
    return Fetch


async def started(job: Any, item: int) -> asyncio.Task[Any]:
    """Start ``job.arun(item)`` in a task, gated, and return it once perform is under way."""
    job.gate = asyncio.Event()
    task = asyncio.create_task(job.arun(item))
    while not job.fences:
        await asyncio.sleep(0.005)
    return task


# -- the contract, on every store ------------------------------------------------------------


def test_arun_awaits_perform_under_the_lock_and_drops_a_duplicate(backend: Backend) -> None:
    job = job_on(backend)

    async def main() -> None:
        first = await started(job, 1)
        assert await job.ais_locked(1) and not await job.ais_locked(2)
        assert await job.arun(1) is None  # the duplicate, dropped while the first runs
        assert await job.aenqueue(1) is None
        job.gate.set()
        assert await first == "fetched 1"
        assert not await job.ais_locked(1)
        assert await job.arun(1) == "fetched 1"  # free again

    job.gate = None
    asyncio.run(main())
    fences = [fence for fence in job.fences if fence is not None]
    assert len(fences) == len(job.fences) and fences[-1] > fences[0]  # each run fenced, greater each time


def test_on_conflict_raise_raises_job_not_unique(backend: Backend) -> None:
    job = job_on(backend, unique_on_conflict="raise")

    async def main() -> None:
        first = await started(job, 7)
        with pytest.raises(JobNotUnique) as caught:
            await job.arun(7)
        assert caught.value.key == job.lock_key(7)
        job.gate.set()
        await first

    asyncio.run(main())


def test_a_sync_perform_runs_through_arun(backend: Backend) -> None:
    class Add(UniqueJob):
        unique_backend = backend

        def perform(self, a: int, b: int) -> int:
            assert current_lock() is not None
            return a + b

    assert run(Add.arun(2, 3)) == 5
    assert run(Add.aenqueue(2, b=4)) == 6
    assert not Add.is_locked(2, 3)


def test_async_with_lock_holds_the_key_for_its_body(backend: Backend) -> None:
    job = job_on(backend)

    async def main() -> None:
        async with job.lock(5) as lock:
            assert isinstance(lock, JobLock) and current_lock() is lock
            assert lock.fence is not None and not lock.lost
            assert await job.ais_locked(5)
            with pytest.raises(JobNotUnique):
                async with job.lock(5):
                    pass
            assert await job.arun(5) is None
        assert current_lock() is None and not await job.ais_locked(5)
        with pytest.raises(RuntimeError, match="body failed"):
            async with job.lock(5):
                raise RuntimeError("body failed")
        assert not await job.ais_locked(5)  # released however the body ends

    asyncio.run(main())
    with job.lock(5) as lock:  # the sync one beside it
        assert job.is_locked(5) and lock.fence is not None
    assert not job.is_locked(5)


@pytest.mark.parametrize(
    "strategy", ["until_executing", "while_executing", "until_and_while_executing", "until_expired"]
)
def test_every_strategy_runs_through_arun(backend: Backend, strategy: str) -> None:
    job = job_on(backend, unique_strategy=strategy, unique_lock_autoexpire=60)
    job.gate = None
    assert run(job.arun(3)) == "fetched 3"
    assert job.is_locked(3) == (strategy == "until_expired")  # only until_expired keeps its key


def test_a_cancelled_arun_releases_its_locks(backend: Backend) -> None:
    job = job_on(backend)

    async def main() -> None:
        task = await started(job, 4)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not await job.ais_locked(4)

    asyncio.run(main())


def test_a_failing_perform_releases_and_raises(backend: Backend) -> None:
    class Boom(UniqueJob):
        unique_backend = backend

        async def perform(self) -> None:
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run(Boom.arun())
    assert not Boom.is_locked()


def test_unique_on_an_async_function_returns_a_coroutine_that_holds_the_lock(backend: Backend) -> None:
    seen: list[bool] = []
    gate = asyncio.Event()

    @unique(backend=backend, on_conflict="raise")
    async def report(account_id: int) -> str:
        seen.append(await report.ais_locked(account_id))
        await gate.wait()
        return f"report {account_id}"

    async def main() -> None:
        gate.set()
        call = report(42)
        assert asyncio.iscoroutine(call) and not await report.ais_locked(42)  # nothing taken yet
        assert await call == "report 42"
        gate.clear()
        first = asyncio.create_task(report(1))
        while len(seen) < 2:
            await asyncio.sleep(0.005)
        with pytest.raises(JobNotUnique):
            await report(1)
        gate.set()
        assert await first == "report 1"

    asyncio.run(main())
    assert seen == [True, True] and report.__name__ == "report"
    with pytest.raises(ConfigurationError, match=r"report\.perform is an async function"):
        report.unique_job.run(3)


def test_many_concurrent_calls_on_few_keys_run_once_each_at_a_time(backend: Backend) -> None:
    running: dict[int, int] = {}
    overlaps: list[int] = []

    class Work(UniqueJob):
        unique_backend = backend

        async def perform(self, key: int) -> int:
            running[key] = running.get(key, 0) + 1
            if running[key] > 1:
                overlaps.append(key)
            await asyncio.sleep(0.01)
            running[key] -= 1
            return key

    async def main() -> list[Any]:
        return await asyncio.gather(*(Work.arun(n % 10) for n in range(100)))

    results = asyncio.run(main())
    assert not overlaps
    ran = [r for r in results if r is not None]
    assert 10 <= len(ran) < 100 and set(ran) == set(range(10))


# -- the store faces -------------------------------------------------------------------------


def test_each_store_has_its_async_face(redis_backend: RedisBackend, file_backend: FileBackend) -> None:
    memory = MemoryBackend()
    assert type(async_backend(memory)) is DirectAsync and async_backend(memory) is async_backend(memory)
    assert type(async_backend(file_backend)) is ThreadAsync
    assert type(async_backend(redis_backend)) is RedisAsync


def test_the_file_store_never_blocks_the_event_loop(file_backend: FileBackend) -> None:
    class Slow(UniqueJob):
        unique_backend = file_backend

        async def perform(self) -> str:
            return "done"

    _path, stripe = file_backend._stripes.of(Slow.lock_key())
    ticks: list[float] = []
    held = threading.Event()
    free = threading.Event()

    def hold_the_stripe() -> None:  # another holder of the key's file lock, for a while
        with file_backend._stripes.locked(stripe):
            held.set()
            free.wait(5)

    async def main() -> str:
        async def ticker() -> None:
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        tick = asyncio.create_task(ticker())
        call = asyncio.create_task(Slow.arun())
        await asyncio.sleep(0.3)
        assert not call.done()  # waiting for the file lock, in a thread...
        count = len(ticks)
        free.set()
        result: str = await call
        tick.cancel()
        assert count > 10  # ...while the loop went on
        return result

    holder = threading.Thread(target=hold_the_stripe)
    holder.start()
    assert held.wait(5)
    assert asyncio.run(main()) == "done"
    holder.join()


def test_the_redis_face_reads_replies_as_the_sync_store_does(redis_backend: RedisBackend) -> None:
    lock = JobLock(redis_backend, "k1", lease=30)

    async def main() -> None:
        assert await lock.aacquire(run=True)
        other = JobLock(redis_backend, "k1")
        assert not await other.aacquire()
        assert (
            other.conflict is not None and other.conflict.run is not None
        )  # the same state the sync store reads
        assert other.conflict.run.token == lock.token
        assert await lock.aheld()
        await lock.arelease()
        assert not await lock.aheld()

    asyncio.run(main())
    assert not lock.held()


def test_the_redis_face_loads_its_scripts_again_after_a_flush(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    job = job_on(redis_backend)
    job.gate = None

    async def main() -> None:
        assert await job.arun(1) == "fetched 1"
        redis_client.script_flush()
        assert await job.arun(1) == "fetched 1"

    asyncio.run(main())


@pytest.mark.slow
def test_calls_cancelled_mid_exchange_leave_no_lock_and_usable_connections(
    redis_backend: RedisBackend,
) -> None:
    job = job_on(redis_backend)
    job.gate = None

    async def main() -> None:
        for turns in range(16):  # cancelled after 0, 1, ... turns of the loop: at every step
            tasks = [asyncio.create_task(job.arun(n)) for n in range(20)]
            for _ in range(turns):
                await asyncio.sleep(0)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # A claim cancelled after it was sent is undone, token-checked, on the undo thread
            # (left, it would hold its key for a whole lease).
            wait_for(lambda: not any(job.is_locked(n) for n in range(20)), f"the undos after {turns} turns")

    asyncio.run(main())

    async def again() -> list[Any]:
        return [await job.arun(n) for n in range(20)]

    assert asyncio.run(again()) == [f"fetched {n}" for n in range(20)]


@pytest.mark.parametrize("strategy", ["until_executed", "while_executing"])
def test_a_release_cancelled_before_it_was_sent_is_made_before_the_cancellation_goes_on(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    # The task is cancelled while its release waits to be sent: nothing reached the store.
    # Left so, the locks would refuse the key for a whole lease (30 s).
    job = job_on(backend, unique_strategy=strategy)
    job.gate = None

    async def main() -> list[str]:
        face = async_backend(backend)
        stall = StallFirst(own(face), "finish")
        route(monkeypatch, face, stall, "finish")
        task = asyncio.create_task(job.arun(1))
        await stall.stalled.wait()
        assert job.is_locked(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return stall.sent

    assert asyncio.run(main()).count("finish") == 1
    assert not job.is_locked(1)
    assert job.fences and asyncio.run(job.arun(1)) == "fetched 1"


def test_a_release_interrupted_by_an_anyio_cancel_scope_is_made_all_the_same(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # anyio (Starlette, FastAPI, task groups) cancels every await inside a cancelled scope
    # again and again: the second try of the release must not be cancelled with it.
    anyio = pytest.importorskip("anyio")  # (not in the [arq] venv of .ci/run)
    job = job_on(backend)
    job.gate = None

    async def main() -> list[str]:
        face = async_backend(backend)
        stall = StallFirst(own(face), "finish", delay=0.01)
        route(monkeypatch, face, stall, "finish")
        async with anyio.create_task_group() as group:
            group.start_soon(job.arun, 1)
            await stall.stalled.wait()
            group.cancel_scope.cancel()
        return stall.sent

    assert asyncio.run(main()).count("finish") == 1
    assert not job.is_locked(1)


def test_a_late_grant_whose_confirming_renewal_is_cancelled_releases_its_locks(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The grant's reply came past the holder's deadline, so the lock is renewed once before
    # the body; the task is cancelled during that renewal. Left, the locks would hold the key
    # for a lease.
    now = [1000.0]
    monkeypatch.setattr(heartbeat, "clock", lambda: now[0])
    lock = JobLock(backend, "k")

    async def main() -> None:
        face = async_backend(backend)
        stall = StallFirst(own(face), "renew")

        async def late(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            reply = await stall(name, args, kwargs)
            if name == "claim":
                now[0] += lock.lease  # the reply arrives past the holder's deadline
            return reply

        route(monkeypatch, face, late, "claim", "renew")

        async def hold() -> None:
            async with lock:
                raise AssertionError("the body must not run")

        task = asyncio.create_task(hold())
        await stall.stalled.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert not lock.held(run_conflicts=True)


def wait_for(condition: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# -- errors -----------------------------------------------------------------------------------


def test_an_unreachable_redis_is_a_backend_error_and_perform_does_not_run(tmp_path: Path) -> None:
    store = RedisBackend(f"unix://{tmp_path}/nothing.sock", timeout=0.5)
    job = job_on(store)
    job.gate = None
    with pytest.raises(BackendError, match=r"nothing\.sock"):
        run(job.arun(1))
    assert job.fences == []


def test_a_failed_start_settles_through_the_async_settle_awaited(tmp_path: Path) -> None:
    # A worker's start that the store fails is settled as a failed delivery; an async
    # queue's settle (arq's) must be awaited, not called and dropped unawaited.
    store = RedisBackend(f"unix://{tmp_path}/nothing.sock", timeout=0.5)
    job = job_on(store, unique_strategy="until_executing")
    job.gate = None
    settled: list[BaseException | None] = []

    async def settle(exc: BaseException | None, result: Any) -> None:
        await asyncio.sleep(0)
        settled.append(exc)

    lock = job.lock_from(job.lock(1).key, "t" * 24)
    with pytest.raises(BackendError, match=r"nothing\.sock"):
        run(job.aexecute(lock, (1,), {}, settle=settle))
    assert len(settled) == 1 and isinstance(settled[0], BackendError)
    assert job.fences == []


_HOLD_STRIPES = """
import fcntl, os, sys
fds = []
for n in range(64):
    fd = os.open(os.path.join(sys.argv[1], ".locks", f"{n:02d}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    fds.append(fd)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_an_inline_start_cancelled_in_flight_is_undone(tmp_path: Path) -> None:
    # while_executing: the start is the call's first lock step. Another process holds every
    # stripe of the file store, so the start waits in its thread; the task is cancelled
    # meanwhile, and the start is applied once the stripes are free. Undone, token-checked:
    # left, its run lock would drop the next call as a duplicate for a whole lease (30 s).
    store = FileBackend(tmp_path / "locks")
    job = job_on(store, unique_strategy="while_executing")
    job.gate = None
    (tmp_path / "locks" / ".locks").mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_STRIPES, str(tmp_path / "locks")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def free() -> None:
        assert holder.stdin is not None
        if not holder.stdin.closed:
            holder.stdin.close()
        holder.wait(10)

    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"

        async def main() -> None:
            task = asyncio.create_task(job.arun(1))
            await asyncio.sleep(0.2)  # the start is waiting for its stripe in a worker thread
            task.cancel()
            await asyncio.sleep(0.2)  # the cancelled task still waits for the start in its thread
            assert not task.done()
            await asyncio.to_thread(free)  # the start goes on in its thread, and is applied now
            with pytest.raises(asyncio.CancelledError):
                await task

        run(main())
    finally:
        free()
    wait_for(lambda: not job.is_locked(1), "the undo of the cancelled start")
    assert run(job.arun(1)) == "fetched 1"


def test_a_client_without_an_asyncio_twin_is_a_configuration_error(redis_server: RedisServer) -> None:
    client = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(redis_server.url))
    job = job_on(RedisBackend(client))
    job.gate = None
    with pytest.raises(ConfigurationError, match=r"the asyncio API takes a plain redis://"):
        run(job.arun(1))


def test_an_async_queue_is_refused_by_the_sync_enqueue() -> None:
    from uniqjob.queues import Queue

    class AsyncQueue(Queue):
        async def push(self, job_cls: Any, lock: JobLock, args: Any, kwargs: Any) -> str:
            return "queued"

    job = job_on(MemoryBackend(), unique_queue=AsyncQueue())
    with pytest.raises(ConfigurationError, match=r"AsyncQueue\.push is async"):
        job.enqueue(1)
    assert not job.is_locked(1)  # the queue lock went with the failed push
    assert run(job.aenqueue(1)) == "queued"
    assert job.is_locked(1)


# -- the heartbeat and lost locks (a real redis-server) ----------------------------------------


@pytest.mark.slow
def test_the_lease_is_kept_while_another_task_blocks_the_loop(redis_backend: RedisBackend) -> None:
    lease = 1.5  # renewed every 0.5 s; the loop is blocked for twice the whole lease
    job = job_on(redis_backend, unique_run_lease=lease)
    seen: dict[str, Any] = {}

    async def main() -> None:
        task = await started(job, 9)

        def blocking() -> None:
            time.sleep(2 * lease)  # CPU-bound or blocking code in another task: the loop is stuck

        def look_from_outside() -> None:
            time.sleep(1.5 * lease)  # past the lease: without renewals it would have lapsed
            seen["locked"] = job.is_locked(9)
            seen["taken"] = JobLock(redis_backend, job.lock_key(9)).acquire(run=True)

        outside = threading.Thread(target=look_from_outside)
        outside.start()
        blocking()
        outside.join()
        job.gate.set()
        assert await task == "fetched 9"

    asyncio.run(main())
    assert seen == {"locked": True, "taken": False}
    assert job.lost is False  # its lease was confirmed all along


def test_a_lost_lock_is_reported_as_on_the_sync_api(
    redis_backend: RedisBackend, caplog: pytest.LogCaptureFixture
) -> None:
    lost: list[JobLock] = []
    watched: dict[str, Any] = {}

    class Watch(UniqueJob):
        unique_backend = redis_backend
        unique_run_lease = 1.0
        unique_on_lost = staticmethod(lost.append)  # type: ignore[assignment]  # (mypy binds a ClassVar callable)

        async def perform(self) -> bool:
            lock = current_lock()
            assert lock is not None and not lock.lost
            watched["fence"] = lock.fence
            redis_backend.purge(lock.key)  # another party removes the run lock
            deadline = time.monotonic() + 5
            while not lock.lost and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert lock.beat is not None
            watched["reason"] = lock.beat.explain()
            return lock.lost

    with caplog.at_level(logging.WARNING, "uniqjob.heartbeat"):
        assert run(Watch.arun()) is True
    assert "no longer holds it" in watched["reason"]
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(lost) == 1 and lost[0].fence == watched["fence"]
    assert any("lost the run lock" in r.getMessage() for r in caplog.records)


def test_an_async_generator_perform_is_refused_when_the_class_is_defined() -> None:
    async def perform(self: object) -> AsyncIterator[int]:
        yield 1

    with pytest.raises(ConfigurationError, match=r"Stream\.perform is an async generator"):
        type("Stream", (UniqueJob,), {"perform": perform})


def test_the_async_face_reads_many_keys_as_the_store_does(backend: Backend) -> None:
    lock = JobLock(backend, "many-1")
    assert lock.acquire()
    face = async_backend(backend)
    states = asyncio.run(face.read_many(["many-1", "many-2"]))
    assert [(s.key, s.queue and s.queue.token) for s in states if not isinstance(s, Exception)] == [
        ("many-1", lock.token),
        ("many-2", None),
    ]
