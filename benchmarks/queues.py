"""Queues: what a unique enqueue costs over the queue's own, in round trips and time (RQ, Celery, arq).

Two private redis-servers: one holds the locks, the other is the queue's (RQ's
Redis, Celery's broker, arq's Redis), so each side's work is counted on its
own. Round trips are the server's read events (``INFO stats``
``total_reads_processed``; every request here is one small write, so one read
each), less the ``INFO`` that asks; commands come from ``INFO commandstats``.
Both are counted over a few calls and divided, so they are the same on any
machine. Times are medians of calls taken in turn (plain, unique, duplicate),
so a machine's drift hits all three alike.

The targets (issue 22): round trips of a unique fresh enqueue = plain + 1 (the
lock store's one), a duplicate = 1 (and nothing on the queue's server), a
worker's job start and finish = 1 each; a unique enqueue within 1.25x (RQ) /
1.3x (Celery, arq) of plain; a duplicate within 1.5x a redis-py PING.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import redis

from benchmarks.report import Report, Row, Target
from benchmarks.sampling import Stats, summarize
from uniqjob import UniqueJob

__all__ = ["PATHS", "Trips", "measure", "run_queues"]

#: Each queue's paths, in report order.
PATHS = ("plain", "unique", "duplicate")
QUEUES = ("rq", "celery", "arq")
_LIMITS = {"rq": 1.25, "celery": 1.3, "arq": 1.3}
_ids = itertools.count()


@dataclass
class Trips:
    """Round trips and commands per call, on the lock store's server and the queue's."""

    locks: float = 0.0
    queue: float = 0.0
    commands: dict[str, Counter[str]] = field(default_factory=dict)
    connections: float = 0.0  # new connections to the lock store per call (their HELLO)

    @property
    def total(self) -> float:
        return self.locks + self.queue


class Servers:
    """The lock store's redis-server and the queue's, and a client of each that counts their work."""

    def __init__(self, locks_url: str, queue_url: str) -> None:
        self.urls = {"locks": locks_url, "queue": queue_url}
        self.admin = {name: redis.Redis.from_url(url) for name, url in self.urls.items()}

    def _snapshot(self) -> dict[str, tuple[int, Counter[str]]]:
        out = {}
        for name, client in self.admin.items():
            info = client.info("all")
            calls = Counter(
                {k.removeprefix("cmdstat_"): v["calls"] for k, v in info.items() if k.startswith("cmdstat_")}
            )
            out[name] = (int(info["total_reads_processed"]), calls)
        return out

    def count(self, calls: int, op: Callable[[], object]) -> Trips:
        """Round trips and commands per call of ``op`` (called ``calls`` times), on each server."""
        before = self._snapshot()
        for _ in range(calls):
            op()
        after = self._snapshot()
        trips = Trips()
        for name in self.admin:
            reads = after[name][0] - before[name][0] - 1  # the INFO of ``after``
            commands = after[name][1] - before[name][1]
            commands["info"] -= 1
            commands = +commands  # drop what is left at zero
            trips.commands[name] = Counter({k: v // calls for k, v in commands.items()})
            setattr(trips, name, reads / calls)
        return trips

    def close(self) -> None:
        for client in self.admin.values():
            client.close()


# -- the jobs (at the top level: a worker imports them) ----------------------------------------


def plain_job(n: int) -> int:
    """What a plain RQ job runs."""
    return n


class RQUnique(UniqueJob):
    """The unique RQ job (its queue set by :func:`_rq`)."""

    def perform(self, n: int) -> int:
        return n


class ArqUnique(UniqueJob):
    """The unique arq job (its queue set by :func:`_arq`)."""

    async def perform(self, n: int) -> int:
        return n


@contextmanager
def _unique_jobs(locks_url: str) -> Iterator[None]:
    import uniqjob

    uniqjob.configure(locks_url)
    try:
        yield
    finally:
        uniqjob.configure(None)


def _timed(ops: dict[str, Callable[[], object]], iterations: int, warmup: int) -> dict[str, Stats]:
    """Median and p99 of each op, the ops called in turn (one sample of each per round)."""
    samples: dict[str, list[int]] = {name: [] for name in ops}
    for i in range(warmup + iterations):
        for name, op in ops.items():
            began = time.perf_counter_ns()
            op()
            took = time.perf_counter_ns() - began
            if i >= warmup:
                samples[name].append(took)
    return {name: summarize(s) for name, s in samples.items()}


# -- RQ -----------------------------------------------------------------------------------------


def _rq(servers: Servers) -> dict[str, Callable[[], object]]:
    from rq import Queue

    from uniqjob.integrations.rq import RQQueue

    queue = Queue("bench", connection=redis.Redis.from_url(servers.urls["queue"]))

    RQUnique.unique_queue = RQQueue(queue)
    RQUnique.enqueue(-1)  # the lock stays: every duplicate meets it
    return {
        "plain": lambda: queue.enqueue(plain_job, next(_ids)),
        "unique": lambda: RQUnique.enqueue(next(_ids)),
        "duplicate": lambda: RQUnique.enqueue(-1),
    }


# -- Celery -------------------------------------------------------------------------------------


def _celery(servers: Servers) -> dict[str, Callable[[], object]]:
    from celery import Celery

    from uniqjob.integrations.celery import UniqueTask

    app = Celery("uniqjob_bench", broker=servers.urls["queue"], set_as_current=False)

    @app.task(name="bench.plain")  # type: ignore[untyped-decorator]
    def celery_plain(n: int) -> int:
        return n

    @app.task(name="bench.unique", base=UniqueTask, unique_lock_autoexpire=3600)  # type: ignore[untyped-decorator]
    def celery_unique(n: int) -> int:
        return n

    celery_unique.delay(-1)
    return {
        "plain": lambda: celery_plain.delay(next(_ids)),
        "unique": lambda: celery_unique.delay(next(_ids)),
        "duplicate": lambda: celery_unique.delay(-1),
    }


# -- arq ----------------------------------------------------------------------------------------


def _arq(servers: Servers, loop: asyncio.AbstractEventLoop) -> dict[str, Callable[[], object]]:
    from arq import create_pool
    from arq.connections import RedisSettings

    from uniqjob.integrations.arq import ArqQueue

    settings = RedisSettings.from_dsn(servers.urls["queue"])
    pool = loop.run_until_complete(create_pool(settings))

    ArqUnique.unique_queue = ArqQueue(pool)

    def run(make: Callable[[], Awaitable[object]]) -> Callable[[], object]:
        return lambda: loop.run_until_complete(make())

    run(lambda: ArqUnique.aenqueue(-1))()
    return {
        "plain": run(lambda: pool.enqueue_job("plain", next(_ids))),
        "unique": run(lambda: ArqUnique.aenqueue(next(_ids))),
        "duplicate": run(lambda: ArqUnique.aenqueue(-1)),
    }


# -- a worker's job start and finish (RQ) ---------------------------------------------------------


class WorkerJob(UniqueJob):
    """The unique job an RQ SimpleWorker runs in :func:`_rq_worker` (its queue set there)."""

    def perform(self, n: int) -> int:
        return n


def _rq_worker(servers: Servers, jobs: int, *, forking: bool = False) -> Trips:
    """Round trips per job of an RQ worker's burst: the lock store's, and the queue's (RQ's own).

    ``forking``: RQ's default Worker, a work horse forked per job (its commands show whether each
    horse opens a connection of its own to the lock store: ``hello``, ``client|setinfo``).
    """
    from rq import Queue, SimpleWorker, Worker

    from uniqjob.integrations.rq import RQQueue

    connection = redis.Redis.from_url(servers.urls["queue"])
    queue = Queue("bench-worker", connection=connection)
    WorkerJob.unique_queue = RQQueue(queue)
    kind = Worker if forking else SimpleWorker
    rq_log = logging.getLogger("rq.worker")
    level = rq_log.level
    rq_log.setLevel(logging.WARNING)
    worker = kind([queue], connection=connection)
    # Each job run as the worker's loop runs it (execute_job: forked or not), without the loop
    # itself, whose pubsub thread may hold a short burst up for half a minute at its end.
    try:
        warm = WorkerJob.enqueue(-1)
        worker.execute_job(warm, queue)  # warm: connections made, scripts loaded
        pushed = [WorkerJob.enqueue(n) for n in range(jobs)]
        order = iter(pushed)
        trips = servers.count(jobs, lambda: worker.execute_job(next(order), queue))
    finally:
        rq_log.setLevel(level)
    done = queue.finished_job_registry.count
    if done != jobs + 1:
        raise RuntimeError(f"the RQ worker finished {done - 1} of {jobs} jobs")
    connection.flushdb()
    connection.close()
    trips.connections = trips.commands["locks"]["hello"]
    return trips


def _arq_worker(servers: Servers, jobs: int, loop: asyncio.AbstractEventLoop) -> Trips:
    """Round trips per job of an arq worker: each job run as its loop runs it (``Worker.run_job``)."""
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.worker import Worker

    from uniqjob.integrations.arq import FUNCTIONS, ArqQueue

    pool = loop.run_until_complete(create_pool(RedisSettings.from_dsn(servers.urls["queue"])))
    ArqUnique.unique_queue = ArqQueue(pool, queue_name="bench-arq")

    async def make() -> Worker:  # made in the loop: arq's Worker keeps the loop it was made in
        return Worker(FUNCTIONS, redis_pool=pool, queue_name="bench-arq", handle_signals=False)

    worker = loop.run_until_complete(make())
    arq_log = logging.getLogger("arq.worker")
    level = arq_log.level
    arq_log.setLevel(logging.WARNING)

    async def run(n: int) -> None:
        job = await ArqUnique.aenqueue(n)
        await worker.run_job(job.job_id, 0)

    try:
        loop.run_until_complete(run(next(_ids)))  # warm: connections made, scripts loaded
        pushed = iter([loop.run_until_complete(ArqUnique.aenqueue(next(_ids))) for _ in range(jobs)])
        trips = servers.count(jobs, lambda: loop.run_until_complete(worker.run_job(next(pushed).job_id, 0)))
    finally:
        arq_log.setLevel(level)
        loop.run_until_complete(worker.close())
    trips.connections = trips.commands["locks"]["hello"]
    return trips


# -- the section --------------------------------------------------------------------------------


def measure(locks_url: str, queue_url: str, *, calls: int = 20) -> dict[str, dict[str, Trips]]:
    """Round trips per call of each queue's paths: ``{queue: {path: Trips}}`` (and RQ's workers)."""
    servers = Servers(locks_url, queue_url)
    loop = asyncio.new_event_loop()
    try:
        with _unique_jobs(locks_url):
            return _count(servers, _all_ops(servers, loop), calls, loop)
    finally:
        loop.close()
        servers.close()


def _count(
    servers: Servers,
    ops: dict[str, dict[str, Callable[[], object]]],
    calls: int,
    loop: asyncio.AbstractEventLoop,
) -> dict[str, dict[str, Trips]]:
    out: dict[str, dict[str, Trips]] = {}
    for name, paths in ops.items():
        for op in paths.values():
            op()  # warm: connections made, scripts loaded
        out[name] = {path: servers.count(calls, op) for path, op in paths.items()}
    out["rq"]["worker"] = _rq_worker(servers, calls)
    out["rq"]["forking worker"] = _rq_worker(servers, calls, forking=True)
    out["arq"]["worker"] = _arq_worker(servers, calls, loop)
    return out


def _all_ops(servers: Servers, loop: asyncio.AbstractEventLoop) -> dict[str, dict[str, Callable[[], object]]]:
    return {"rq": _rq(servers), "celery": _celery(servers), "arq": _arq(servers, loop)}


def run_queues(report: Report, locks_url: str, queue_url: str, iterations: int, warmup: int) -> None:
    """The queues section: rows of times and round trips, and the issue's targets, into ``report``."""
    servers = Servers(locks_url, queue_url)
    ping = redis.Redis.from_url(locks_url)
    loop = asyncio.new_event_loop()
    try:
        with _unique_jobs(locks_url):
            ops = _all_ops(servers, loop)
            trips = _count(servers, ops, 20, loop)
            for name, paths in ops.items():
                timed = _timed({"ping": ping.ping, **paths}, iterations, warmup)
                for path in PATHS:
                    t, stats = trips[name][path], timed[path]
                    row = Row(
                        f"queues.{name}.{path}", f"{name}: {path} enqueue", stats.median_us, stats.p99_us
                    )
                    row.n = stats.n
                    row.floor, row.floor_median_us, row.floor_p99_us = (
                        "PING",
                        timed["ping"].median_us,
                        timed["ping"].p99_us,
                    )
                    row.ratio = stats.median_us / timed["ping"].median_us
                    row.extra = {"round trips to the locks": t.locks, "to the queue": t.queue}
                    report.rows.append(row)
                _targets(report, name, trips[name], timed)
    finally:
        loop.close()
        ping.close()
        servers.close()
    for kind in ("worker", "forking worker"):
        worker = trips["rq"][kind]
        figure = kind.replace(" ", "_")
        report.figures[f"queues_rq_{figure}_lock_trips_per_job"] = worker.locks
        report.figures[f"queues_rq_{figure}_lock_connections_per_job"] = worker.connections
    report.figures["queues_arq_worker_lock_trips_per_job"] = trips["arq"]["worker"].locks
    report.targets += [
        Target(
            f"queues.{name}.worker",
            f"{name}: {kind} round trips to the locks per job (start + finish)",
            trips[name]["worker"].locks,
            2,
            "",
        )
        for name, kind in (("rq", "SimpleWorker"), ("arq", "worker"))
    ]


def _targets(report: Report, name: str, trips: dict[str, Trips], timed: dict[str, Stats]) -> None:
    plain, unique, dup = trips["plain"], trips["unique"], trips["duplicate"]
    ping = timed["ping"].median_us
    report.targets += [
        Target(
            f"queues.{name}.unique.trips",
            f"{name}: unique round trips over plain ({plain.total:g})",
            unique.total - plain.total,
            1,
            "",
        ),
        Target(
            f"queues.{name}.duplicate.trips",
            f"{name}: duplicate round trips ({dup.queue:g} to the queue)",
            dup.total,
            1,
            "",
        ),
        Target(
            f"queues.{name}.unique.ratio",
            f"{name}: unique enqueue / plain",
            timed["unique"].median_us / timed["plain"].median_us,
            _LIMITS[name],
            "x",
        ),
        Target(
            f"queues.{name}.duplicate.ratio",
            f"{name}: duplicate / PING",
            timed["duplicate"].median_us / ping,
            1.5,
            "x",
        ),
    ]


def run_section(report: Report, locks_url: str, iterations: int, warmup: int) -> None:
    """``python -m benchmarks``'s queues section: the queue on a private redis-server of its own."""
    from tests.redis_server import RedisServer

    with RedisServer() as queue_server:
        run_queues(report, locks_url, queue_server.url, iterations, warmup)
