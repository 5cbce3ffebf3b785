"""Queues: what a unique enqueue costs over the queue's own, in round trips and time (RQ, Celery, arq,
Dramatiq).

Two private redis-servers: one holds the locks, the other is the queue's (RQ's
Redis, Celery's broker, arq's Redis, Dramatiq's Redis broker), so each side's work is counted on its
own. Round trips are the server's read events (``INFO stats``
``total_reads_processed``; every request here is one small write, so one read
each), less the ``INFO`` that asks; commands come from ``INFO commandstats``.
Both are counted over a few calls and divided, so they are the same on any
machine. Times are medians of calls taken in turn (plain, unique, duplicate),
so a machine's drift hits all three alike.

The RQ worker bursts: trivial jobs enqueued, then run by a fresh ``rq``
SimpleWorker process (``work(burst=True)``), plain bursts and unique ones (a
distinct key each) in turn; jobs/s of each, their medians and ratio (the
per-round table goes to stderr, the medians to the target's note and the
figures); the forking Worker's too, fewer jobs, as information. Beside the
SimpleWorker's, its floor: bursts of plain jobs that each send the two calls a
unique job's worker sends the lock store (START and FINISH, recorded from a real
worker), raw by ``client.evalsha`` on a fresh key, so what the round trips alone
cost is measured in the same rounds as what uniqjob costs. The lock
store is the section's server and RQ's the queue's, as for the enqueues: each
server's ``INFO`` then shows its side alone, so the lock store's round trips per
job (start and finish) are counted exactly, and the queue's show that RQ's own
work is the same for unique jobs as for plain ones.

The targets (issue 22): round trips of a unique fresh enqueue = plain + 1 (the
lock store's one), a duplicate = 1 (and nothing on the queue's server), a
worker's job start and finish = 1 each; a unique enqueue within 1.25x (RQ) /
1.3x (Celery, arq) / 2.1x (Dramatiq, whose plain send is one round trip) of plain; a
duplicate within 1.5x a redis-py PING; a SimpleWorker burst of 1,000 unique jobs within
10 % of the plain jobs' rate (median of 5 pairs).
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import logging
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from benchmarks.replay import Raw, Sent, record
from benchmarks.report import Report, Row, Target
from benchmarks.sampling import Stats, summarize
from uniqjob import UniqueJob

__all__ = ["PATHS", "Bursts", "Trips", "burst_worker", "bursts", "measure", "run_bursts", "run_queues"]

#: Each queue's paths, in report order.
PATHS = ("plain", "unique", "duplicate")
#: arq pins a redis-py that Celery's kombu refuses, so ``.[test]`` leaves it out (docs/arq.md): its
#: rows are made only where it is installed beside the others.
HAVE_ARQ = importlib.util.find_spec("arq") is not None
QUEUES = ("rq", "celery", "arq", "dramatiq") if HAVE_ARQ else ("rq", "celery", "dramatiq")
# Dramatiq's plain send is one round trip (one script on its Redis), so a unique one's two.
_LIMITS = {"rq": 1.25, "celery": 1.3, "arq": 1.3, "dramatiq": 2.1}
_ids = itertools.count()


@dataclass
class Trips:
    """Round trips and commands per call, on the lock store's server and the queue's."""

    locks: float = 0.0
    queue: float = 0.0
    commands: dict[str, Counter[str]] = field(default_factory=dict)
    connections: float = 0.0  # new connections to the lock store per call

    @property
    def total(self) -> float:
        return self.locks + self.queue


class Servers:
    """The lock store's redis-server and the queue's, and a client of each that counts their work."""

    def __init__(self, locks_url: str, queue_url: str) -> None:
        self.urls = {"locks": locks_url, "queue": queue_url}
        self.admin = {name: redis.Redis.from_url(url) for name, url in self.urls.items()}

    def _snapshot(self) -> dict[str, tuple[int, int, Counter[str]]]:
        out = {}
        for name, client in self.admin.items():
            info = client.info("all")
            calls = Counter(
                {k.removeprefix("cmdstat_"): v["calls"] for k, v in info.items() if k.startswith("cmdstat_")}
            )
            out[name] = (int(info["total_reads_processed"]), int(info["total_connections_received"]), calls)
        return out

    def count(self, calls: int, op: Callable[[], object]) -> Trips:
        """Round trips and commands per call of ``op`` (called ``calls`` times), on each server."""
        before = self._snapshot()
        for _ in range(calls):
            op()
        return self._per_call(before, self._snapshot(), calls)

    def _per_call(
        self,
        before: dict[str, tuple[int, int, Counter[str]]],
        after: dict[str, tuple[int, int, Counter[str]]],
        calls: int,
    ) -> Trips:
        """Round trips and commands per call between two snapshots (less the ``INFO`` of ``after``)."""
        trips = Trips()
        for name in self.admin:
            reads = after[name][0] - before[name][0] - 1  # the INFO of ``after``
            commands = after[name][2] - before[name][2]
            commands["info"] -= 1
            commands = +commands  # drop what is left at zero
            trips.commands[name] = Counter({k: v // calls for k, v in commands.items()})
            setattr(trips, name, reads / calls)
            if name == "locks":
                trips.connections = (after[name][1] - before[name][1]) / calls
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


# -- Dramatiq ------------------------------------------------------------------------------------


def dramatiq_plain(n: int) -> int:
    """What the plain Dramatiq actor runs."""
    return n


def dramatiq_unique(n: int) -> int:
    """What the unique Dramatiq actor runs."""
    return n


def _dramatiq(servers: Servers) -> dict[str, Callable[[], object]]:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    from uniqjob.integrations.dramatiq import UniqueMiddleware

    broker = RedisBroker(url=servers.urls["queue"])  # type: ignore[no-untyped-call]
    broker.add_middleware(UniqueMiddleware())
    plain = dramatiq.actor(broker=broker, queue_name="bench")(dramatiq_plain)
    unique = dramatiq.actor(broker=broker, queue_name="bench", unique=True, unique_lock_autoexpire=3600)(
        dramatiq_unique
    )
    unique.send(-1)
    return {
        "plain": lambda: plain.send(next(_ids)),
        "unique": lambda: unique.send(next(_ids)),
        "duplicate": lambda: unique.send(-1),
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
    return trips


# -- an RQ worker's burst: jobs/s of plain jobs and of unique ones --------------------------------

#: The RQ queue of the bursts, on the queue's server.
BURST_QUEUE = "bench-burst"
#: A burst's jobs, and the pairs (plain, unique) of bursts (issue 22: 1,000 jobs, median of 5 pairs).
BURST_JOBS, BURST_PAIRS = 1000, 5
#: The forking Worker's bursts (information only: a fork per job makes them slow).
FORKING_JOBS, FORKING_PAIRS = 100, 1
#: The most a unique burst's rate may fall below the plain one's, in percent.
BURST_LIMIT = 10.0
#: A SimpleWorker's bursts: plain jobs, unique jobs, and the floor (plain jobs that send a unique
#: job's two lock-store calls raw), in a turn that moves each round, so drift hits all three alike.
BURST_PATHS = ("plain", "unique", "floor")
#: What a worker process of :func:`burst_worker` runs: it imports this module, from the repository's root.
_CHILD = "import sys; from benchmarks.queues import burst_worker; sys.exit(burst_worker(sys.argv[1:]))"
_ROOT = Path(__file__).resolve().parent.parent
_burst_ids = itertools.count()


class BurstJob(UniqueJob):
    """The unique job of a burst (its queue set by :func:`_burst_queue`, in the parent and the worker)."""

    def perform(self, n: int) -> int:
        return n


def _burst_queue(queue_url: str) -> Any:
    """The bursts' ``rq.Queue`` on ``queue_url``; :class:`BurstJob` enqueues into it."""
    from rq import Queue

    from uniqjob.integrations.rq import RQQueue

    queue = Queue(BURST_QUEUE, connection=redis.Redis.from_url(queue_url))
    BurstJob.unique_queue = RQQueue(queue)
    return queue


#: In a floor burst's worker process, the recorded START and FINISH of a unique job, sent again raw
#: on a fresh lock key per call (set by :func:`burst_worker`, run by :func:`floor_job`).
_floor_calls: Callable[[], object] | None = None


def floor_job(n: int) -> int:
    """A floor burst's plain RQ job: what a unique job's worker sends to the lock store, with no
    Python of uniqjob's around it (the unique rate can come no nearer the plain one than this)."""
    assert _floor_calls is not None, "a floor job runs only in a floor burst's worker"
    _floor_calls()
    return n


def _worker_calls(servers: Servers) -> str:
    """The lock-store commands one unique job costs an RQ SimpleWorker (its START and FINISH),
    recorded from a real worker run in this process, as JSON for a floor burst's worker."""
    from rq import SimpleWorker

    from uniqjob.config import default_backend

    queue = _burst_queue(servers.urls["queue"])
    BurstJob.enqueue(next(_burst_ids))
    client = default_backend().client  # type: ignore[attr-defined]
    worker = SimpleWorker([queue], connection=queue.connection)
    sent, _ = record(client, lambda: worker.work(burst=True, logging_level="WARNING"))
    queue.connection.flushdb()
    queue.connection.close()
    # (A fresh server first has the scripts loaded: once, not per job, so not part of the floor.)
    commands = [[a.decode() if isinstance(a, bytes) else a for a in s.args] for s in sent]
    commands = [c for c in commands if str(c[0]).upper() != "SCRIPT LOAD"]
    if [str(c[0]).upper() for c in commands] != ["EVALSHA", "EVALSHA"]:
        raise RuntimeError(f"a unique job's worker sent {commands!r} to the lock store, not START and FINISH")
    return json.dumps(commands)


def burst_worker(argv: list[str]) -> int:
    """A fresh worker process's burst: ``KIND LOCKS_URL QUEUE_URL LAST_JOB_ID [FLOOR]`` (KIND: simple,
    forking; FLOOR: the commands :func:`floor_job` replays, from :func:`_worker_calls`).

    Everything is imported and set up alike for plain and unique bursts before the clock starts;
    the clock stops when the last job ended (RQ's ``ended_at``), not when ``work()`` returns,
    which waits up to a second for the worker's pubsub thread. Prints ``{"seconds": ...,
    "finished": ...}``.
    """
    from rq import SimpleWorker, Worker
    from rq.job import Job

    import uniqjob
    from uniqjob.config import default_backend

    global _floor_calls
    kind, locks_url, queue_url, last_id, *floor = argv
    uniqjob.configure(locks_url)
    if floor:  # the store's own client, as a unique job's calls have it
        sent = [Sent(tuple(args), {}, None) for args in json.loads(floor[0])]
        _floor_calls = Raw(default_backend().client, sent, fresh=True).op()  # type: ignore[attr-defined]
    queue = _burst_queue(queue_url)
    worker = (Worker if kind == "forking" else SimpleWorker)([queue], connection=queue.connection)
    began = datetime.now(UTC)
    worker.work(burst=True, logging_level="WARNING")
    ended = Job.fetch(last_id, connection=queue.connection).ended_at
    if ended is None:
        raise RuntimeError(f"the burst's last job {last_id} never ended")
    if ended.tzinfo is None:
        ended = ended.replace(tzinfo=UTC)
    finished = queue.finished_job_registry.count
    print(json.dumps({"seconds": (ended - began).total_seconds(), "finished": finished}))
    return 0


@dataclass
class Burst:
    """One burst of a fresh worker process: its jobs, their seconds, and round trips per job."""

    path: str  # "plain", "unique" or "floor"
    jobs: int
    seconds: float
    trips: Trips

    @property
    def rate(self) -> float:
        """Jobs per second."""
        return self.jobs / self.seconds


@dataclass
class Bursts:
    """Rounds of bursts of one kind of worker: plain and unique (and the SimpleWorker's floor)."""

    worker: str  # "SimpleWorker" or "Worker"
    jobs: int
    pairs: list[dict[str, Burst]] = field(default_factory=list)

    def median(self, path: str) -> float:
        """The median rate of ``path``'s bursts, jobs/s."""
        return statistics.median(pair[path].rate for pair in self.pairs)

    @property
    def ratio(self) -> float:
        """Unique jobs/s over plain jobs/s (the medians)."""
        return self.median("unique") / self.median("plain")

    @property
    def pair_ratio(self) -> float:
        """The median of each pair's unique/plain ratio (information: the target takes the medians')."""
        return statistics.median(pair["unique"].rate / pair["plain"].rate for pair in self.pairs)

    @property
    def slowdown(self) -> float:
        """How far the unique rate falls below the plain one, in percent."""
        return (1 - self.ratio) * 100

    @property
    def floor_slowdown(self) -> float | None:
        """How far the floor's rate falls below the plain one, in percent (None: no floor bursts)."""
        if "floor" not in self.pairs[0]:
            return None
        return (1 - self.median("floor") / self.median("plain")) * 100

    def table(self) -> list[str]:
        """The pairs, their medians and ratio, as lines of text."""
        lines = [f"RQ {self.worker} burst of {self.jobs:,} trivial jobs, jobs/s (fresh worker process each):"]
        goal = (
            f"target: within {BURST_LIMIT:g}%" if self.worker == "SimpleWorker" else "information: no target"
        )
        for i, pair in enumerate(self.pairs, 1):
            plain, unique = pair["plain"].rate, pair["unique"].rate
            floor = f"  floor {pair['floor'].rate:7,.0f}" if "floor" in pair else ""
            lines.append(
                f"  pair {i}: plain {plain:7,.0f}  unique {unique:7,.0f}  ratio {unique / plain:.3f}{floor}"
            )
        lines.append(
            f"  median: plain {self.median('plain'):7,.0f}  unique {self.median('unique'):7,.0f}"
            f"  ratio {self.ratio:.3f} (unique {self.slowdown:+.1f}% slower; {goal})"
        )
        lines.append(f"  median of the pairs' own ratios: {self.pair_ratio:.3f}")
        if self.floor_slowdown is not None:
            lines.append(
                f"  floor: plain jobs that also send a unique job's START and FINISH raw (client.evalsha):"
                f" {self.median('floor'):,.0f}/s, {self.floor_slowdown:+.1f}% slower than plain"
                " (the two round trips alone, no Python of ours)"
            )
        plain_trips, unique_trips = self.trips("plain"), self.trips("unique")
        lines.append(
            f"  round trips per job: plain {plain_trips.queue:.2f} to the queue;"
            f" unique {unique_trips.queue:.2f} to the queue, {unique_trips.locks:.2f} to the locks"
        )
        return lines

    def trips(self, path: str) -> Trips:
        """Round trips per job of ``path``'s bursts, on each server, averaged over the pairs
        (a worker's start-up, ``HELLO`` and all, shared by its jobs)."""
        bursts = [pair[path].trips for pair in self.pairs]
        return Trips(
            locks=statistics.fmean(t.locks for t in bursts),
            queue=statistics.fmean(t.queue for t in bursts),
            commands=bursts[-1].commands,
        )


def _burst(servers: Servers, path: str, jobs: int, kind: str, floor: str = "") -> Burst:
    """Enqueue ``jobs`` trivial ``path`` jobs (unique: distinct keys), then run them in a fresh worker
    (a floor burst's jobs replay ``floor``, from :func:`_worker_calls`)."""
    queue = _burst_queue(servers.urls["queue"])
    if path == "unique":
        pushed = [BurstJob.enqueue(next(_burst_ids)) for _ in range(jobs)]
    else:  # pipelined: the enqueues are not what is timed
        job = floor_job if path == "floor" else plain_job
        pushed = queue.enqueue_many([queue.prepare_data(job, (next(_burst_ids),)) for _ in range(jobs)])
    before = servers._snapshot()
    argv = [kind, servers.urls["locks"], servers.urls["queue"], pushed[-1].id]
    if path == "floor":
        argv.append(floor)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *argv],
        cwd=_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    trips = servers._per_call(before, servers._snapshot(), jobs)
    if done.returncode != 0:
        raise RuntimeError(f"the {kind} RQ worker's burst failed:\n{done.stderr}")
    result = json.loads(done.stdout.splitlines()[-1])
    if result["finished"] != jobs:
        raise RuntimeError(f"the {kind} RQ worker finished {result['finished']} of {jobs} {path} jobs")
    queue.connection.flushdb()  # every burst starts from an empty queue server
    queue.connection.close()
    return Burst(path, jobs, result["seconds"], trips)


def bursts(servers: Servers, jobs: int, pairs: int, *, forking: bool = False) -> Bursts:
    """``pairs`` rounds of bursts of ``jobs`` jobs, in a turn that moves each round so drift hits all:
    plain and unique (ABBA), and for a SimpleWorker the floor too (:data:`BURST_PATHS`)."""
    out = Bursts("Worker" if forking else "SimpleWorker", jobs)
    kind = "forking" if forking else "simple"
    with _unique_jobs(servers.urls["locks"]):  # as the worker processes have it
        floor = "" if forking else _worker_calls(servers)
        for i in range(pairs):
            if forking:
                order: tuple[str, ...] = ("plain", "unique") if i % 2 == 0 else ("unique", "plain")
            else:
                order = BURST_PATHS[i % 3 :] + BURST_PATHS[: i % 3]
            out.pairs.append({path: _burst(servers, path, jobs, kind, floor) for path in order})
    return out


def _burst_plan(iterations: int) -> tuple[int, int, int, int]:
    """Jobs and pairs of the SimpleWorker's bursts and the forking Worker's: fewer for a quick run."""
    if iterations >= BURST_JOBS:
        return BURST_JOBS, BURST_PAIRS, FORKING_JOBS, FORKING_PAIRS
    return min(50, iterations), 2, 10, 1  # --quick: the shape, not the figures


def run_bursts(report: Report, locks_url: str, queue_url: str, iterations: int) -> list[Bursts]:
    """The RQ worker bursts: the SimpleWorker's against its target, the forking Worker's as information."""
    jobs, pairs, forking_jobs, forking_pairs = _burst_plan(iterations)
    servers = Servers(locks_url, queue_url)
    try:
        simple = bursts(servers, jobs, pairs)
        forking = bursts(servers, forking_jobs, forking_pairs, forking=True)
    finally:
        servers.close()
    for found in (simple, forking):
        print("\n".join(found.table()), file=sys.stderr, flush=True)
        name = "queues_rq_burst" if found is simple else "queues_rq_forking_burst"
        unique = found.trips("unique")
        report.figures.update(
            {
                f"{name}_jobs": found.jobs,
                f"{name}_pairs": len(found.pairs),
                f"{name}_plain_jobs_per_s": found.median("plain"),
                f"{name}_unique_jobs_per_s": found.median("unique"),
                f"{name}_ratio": found.ratio,
                f"{name}_median_pair_ratio": found.pair_ratio,
                f"{name}_lock_trips_per_job": unique.locks,
                f"{name}_queue_trips_per_job_plain": found.trips("plain").queue,
                f"{name}_queue_trips_per_job_unique": unique.queue,
            }
        )
        if found.floor_slowdown is not None:
            report.figures[f"{name}_floor_jobs_per_s"] = found.median("floor")
            report.figures[f"{name}_floor_slowdown"] = found.floor_slowdown
    report.targets.append(
        Target(
            "queues.rq.burst",
            f"rq: SimpleWorker burst of {jobs:,} trivial jobs, unique jobs/s below plain's",
            simple.slowdown,
            BURST_LIMIT,
            "%",
            note=(
                f"median of {len(simple.pairs)} pairs: plain {simple.median('plain'):,.0f}/s,"
                f" unique {simple.median('unique'):,.0f}/s, ratio {simple.ratio:.3f};"
                f" its two lock-store calls sent raw alone make it {simple.floor_slowdown:+.1f}%"
            ),
        )
    )
    return [simple, forking]


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
    if HAVE_ARQ:
        out["arq"]["worker"] = _arq_worker(servers, calls, loop)
    return out


def _all_ops(servers: Servers, loop: asyncio.AbstractEventLoop) -> dict[str, dict[str, Callable[[], object]]]:
    ops = {"rq": _rq(servers), "celery": _celery(servers)}
    if HAVE_ARQ:
        ops["arq"] = _arq(servers, loop)
    ops["dramatiq"] = _dramatiq(servers)
    return ops


def run_queues(report: Report, locks_url: str, queue_url: str, iterations: int, warmup: int) -> None:
    """The queues section: rows of times and round trips, and the issue's targets, into ``report``."""
    servers = Servers(locks_url, queue_url)
    ping = redis.Redis.from_url(locks_url)
    loop = asyncio.new_event_loop()
    try:
        with _unique_jobs(locks_url):
            ops = _all_ops(servers, loop)
            trips = _count(servers, ops, 20, loop)
            claims = _claim_floors(ops, loop)
            for name, paths in ops.items():
                floors = {"ping": ping.ping, "claim": claims[name]}
                if name == "arq":
                    floors["turn"] = _loop_turn(loop)
                timed = _timed({**floors, **paths}, iterations, warmup)
                for path in (*PATHS, "claim"):
                    stats = timed[path]
                    label = f"{name}: {path} enqueue" if path in PATHS else f"{name}: the claim alone, raw"
                    row = Row(f"queues.{name}.{path}", label, stats.median_us, stats.p99_us)
                    row.n = stats.n
                    row.floor, row.floor_median_us, row.floor_p99_us = (
                        "PING",
                        timed["ping"].median_us,
                        timed["ping"].p99_us,
                    )
                    row.ratio = stats.median_us / timed["ping"].median_us
                    if path in PATHS:
                        t = trips[name][path]
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
    workers = [("rq", "SimpleWorker"), ("arq", "worker")] if HAVE_ARQ else [("rq", "SimpleWorker")]
    if HAVE_ARQ:
        report.figures["queues_arq_worker_lock_trips_per_job"] = trips["arq"]["worker"].locks
    report.targets += [
        Target(
            f"queues.{name}.worker",
            f"{name}: {kind} round trips to the locks per job (start + finish)",
            trips[name]["worker"].locks,
            2,
            "",
        )
        for name, kind in workers
    ]


def _loop_turn(loop: asyncio.AbstractEventLoop) -> Callable[[], object]:
    """One ``run_until_complete`` of a coroutine that awaits nothing: what arq's calls pay the loop."""

    async def nothing() -> None:
        return None

    return lambda: loop.run_until_complete(nothing())


def _claim_floors(
    ops: dict[str, dict[str, Callable[[], object]]], loop: asyncio.AbstractEventLoop
) -> dict[str, Callable[[], object]]:
    """Each queue's floor for its claim: the CLAIM its duplicate sends, sent again by ``client.evalsha``.

    Recorded from each sync queue's duplicate on the lock store's client. arq's duplicate goes
    through the store's asyncio client, each call in ``loop.run_until_complete`` as the benchmark
    runs arq's calls: its floor is RQ's CLAIM (the same script, arguments of the same sizes) awaited
    on that client, in that loop, so the loop's own cost is in the floor as in the duplicate.
    """
    from uniqjob.config import default_backend
    from uniqjob.stores.aio import async_backend
    from uniqjob.stores.redis import RedisBackend
    from uniqjob.stores.redis._async import RedisAsync

    store = default_backend()
    assert isinstance(store, RedisBackend)
    floors: dict[str, Callable[[], object]] = {}
    claims: dict[str, tuple[Any, ...]] = {}
    for name, paths in ops.items():
        sent, _ = record(store.client, paths["duplicate"])
        if sent:  # (arq's sends nothing through the sync client)
            floors[name] = Raw(store.client, sent, fresh=False).op()
            claims[name] = sent[0].args
    if "arq" in ops:
        face = async_backend(store)
        assert isinstance(face, RedisAsync)

        async def client() -> Any:
            return face.wire().client  # the running loop's: the one arq's duplicates use

        aclient = loop.run_until_complete(client())
        _, sha, numkeys, *items = claims["rq"]
        floors["arq"] = lambda: loop.run_until_complete(aclient.evalsha(sha, numkeys, *items))
    return floors


def _targets(report: Report, name: str, trips: dict[str, Trips], timed: dict[str, Stats]) -> None:
    plain, unique, dup = trips["plain"], trips["unique"], trips["duplicate"]
    ping = timed["ping"].median_us
    # What no Python of ours could beat, on this machine in these rounds: the queue's own enqueue
    # plus the claim's raw round trip; a duplicate is that claim alone.
    # (arq's raw claim is awaited in a turn of the loop of its own, and a unique enqueue is one
    # turn: that turn is counted once.)
    turn = timed["turn"].median_us if "turn" in timed else 0.0
    reachable = (timed["plain"].median_us + timed["claim"].median_us - turn) / timed["plain"].median_us
    raw_dup = timed["claim"].median_us / ping
    report.figures[f"queues_{name}_unique_ratio_without_python"] = reachable
    python_us = timed["duplicate"].median_us - timed["claim"].median_us
    report.figures[f"queues_{name}_duplicate_python_us"] = python_us
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
            note=f"the claim's raw round trip alone makes it {reachable:.2f}x here",
        ),
        Target(
            f"queues.{name}.duplicate.ratio",
            f"{name}: duplicate / PING",
            timed["duplicate"].median_us / ping,
            1.5,
            "x",
            note=f"its raw claim alone: {raw_dup:.2f}x",
        ),
        Target(
            f"queues.{name}.duplicate.floor",
            f"{name}: duplicate / its claim's raw EVALSHA (issue 21's rule for a duplicate)",
            timed["duplicate"].median_us / timed["claim"].median_us,
            1.35,
            "x",
        ),
    ]


def run_section(report: Report, locks_url: str, iterations: int, warmup: int) -> None:
    """``python -m benchmarks``'s queues section: the queue on a private redis-server of its own."""
    from tests.redis_server import RedisServer

    with RedisServer() as queue_server:
        run_queues(report, locks_url, queue_server.url, iterations, warmup)
        run_bursts(report, locks_url, queue_server.url, iterations)
