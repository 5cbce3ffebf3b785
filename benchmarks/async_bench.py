"""The asyncio section: the asyncio API on Redis beside an async PING, and many calls in one event loop."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Callable

import redis

from benchmarks.report import Report, Row
from benchmarks.sampling import ainterleaved
from benchmarks.workload import job_class
from uniqjob import JobLock, UniqueJob
from uniqjob.locks import QueueMeta
from uniqjob.stores.aio import async_backend
from uniqjob.stores.redis import RedisBackend
from uniqjob.stores.redis._async import RedisAsync

__all__ = ["run_async"]

LABELS = {
    "joblock.fresh": "fresh enqueue · await JobLock.aacquire()",
    "job.fresh": "fresh enqueue · await UniqueJob.aenqueue()",
    "joblock.duplicate": "duplicate rejected · await JobLock.aacquire()",
    "job.duplicate": "duplicate rejected · await UniqueJob.aenqueue()",
}

#: The concurrent section: this many ``arun`` calls at once, over this many keys.
CALLS, KEYS = 1000, 100


def run_async(report: Report, client: redis.Redis, iterations: int, warmup: int, rounds: int = 5) -> None:
    """Time the asyncio API against an async PING on the same client; then 1,000 concurrent arun calls."""
    asyncio.run(_run(report, client, iterations, warmup, rounds))


async def _run(report: Report, client: redis.Redis, iterations: int, warmup: int, rounds: int) -> None:
    backend = RedisBackend(client, namespace="bench-async")
    face = async_backend(backend)
    assert isinstance(face, RedisAsync)
    job = job_class(backend)
    ids = itertools.count()
    meta = QueueMeta(job.job_name(), "1234")
    held_key, held_id = f"{job.job_name()}:1:held", -1
    if not await JobLock(backend, held_key, meta=meta).aacquire() or await job.aenqueue(held_id) is None:
        raise RuntimeError(f"{backend!r} already holds the benchmark's keys: use a fresh store")

    async def lock_fresh() -> Callable[[], object]:
        lock = JobLock(backend, f"{job.job_name()}:1:{next(ids):x}", meta=meta)
        if not await lock.aacquire():
            raise RuntimeError("a fresh key was already locked")
        return lock.dequeue

    async def lock_duplicate() -> None:
        if await JobLock(backend, held_key, meta=meta).aacquire():
            raise RuntimeError("a duplicate was let through")

    async def job_fresh() -> Callable[[], object]:
        lock = await job.aenqueue(next(ids))
        if lock is None:
            raise RuntimeError("a fresh call was taken for a duplicate")
        return lock.dequeue  # type: ignore[no-any-return]

    async def job_duplicate() -> None:
        if await job.aenqueue(held_id) is not None:
            raise RuntimeError("a duplicate was let through")

    ops = {
        "joblock.fresh": lock_fresh,
        "job.fresh": job_fresh,
        "joblock.duplicate": lock_duplicate,
        "job.duplicate": job_duplicate,
    }
    results = await ainterleaved([(face.ping, op) for op in ops.values()], iterations, warmup)
    for name, sample in zip(ops, results, strict=True):
        # The ratio to PING is information: the targets are the Redis section's, against the raw scripts.
        report.rows.append(Row.timed(f"async.{name}", f"asyncio · {LABELS[name]}", sample, "async PING"))
    await _concurrent(report, backend, rounds)
    await face.aclose()


async def _concurrent(report: Report, backend: RedisBackend, rounds: int) -> None:
    """1,000 ``arun`` calls on 100 keys at once in this loop, ``rounds`` times: calls per second."""

    class Crowd(UniqueJob):
        unique_backend = backend

        async def perform(self, key: int) -> int:
            await asyncio.sleep(0)  # gives way once, as real async work does
            return key

    seconds: list[float] = []
    ran = 0
    for _ in range(rounds):
        began = time.perf_counter()
        done = await asyncio.gather(*(Crowd.arun(n % KEYS) for n in range(CALLS)))
        seconds.append(time.perf_counter() - began)
        ran += sum(result is not None for result in done)
    median = statistics.median(seconds)
    report.rows.append(
        Row(
            "async.concurrent",
            f"asyncio · {CALLS:,} concurrent arun() on {KEYS} keys, one event loop (per round)",
            median_us=median * 1e6,
            p99_us=max(seconds) * 1e6,
            n=rounds,
            extra={"calls_per_s": round(CALLS / median), "ran_per_round": ran / rounds},
        )
    )
    report.figures.update(
        async_concurrent_calls_per_s=round(CALLS / median), async_concurrent_ran=ran / rounds
    )
