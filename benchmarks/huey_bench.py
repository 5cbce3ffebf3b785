"""Huey: what a unique enqueue costs over Huey's own, in round trips and time (``--only huey``).

Measured as the queues section measures RQ, Celery and arq (:mod:`benchmarks.queues`):
the locks on one private redis-server, Huey's storage on another, each side's
round trips counted by its own server; times are medians of calls taken in turn
(plain, unique, duplicate). A consumer's side, a task's start and finish, is
counted by running dequeued tasks in this process as a consumer's worker thread
does (``huey.execute(huey.dequeue())``).

The targets (issue 25, as for the other queues): a unique enqueue = Huey's round
trips + 1 (the lock store's claim), a duplicate = 1 and nothing of Huey's, a
task's start and finish on a consumer = 1 round trip each; a duplicate within 1.5x a
redis-py PING. Huey's own enqueue is a single LPUSH, as cheap as the lock store's claim,
so a unique enqueue is about twice a plain one by construction (RQ's enqueue is several
round trips, which hide the claim): the time target is what the integration adds to
Huey's enqueue, ``unique - plain``, within 1.3x of a duplicate (the claim alone).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import redis

from benchmarks.queues import PATHS, Servers, Trips, _timed, _unique_jobs
from benchmarks.report import Report, Row, Target

__all__ = ["measure", "run_section"]

#: What a unique enqueue adds to Huey's, over a duplicate's time (the claim alone), at most.
LIMIT = 1.3
_ids = itertools.count()


def plain_task(n: int) -> int:
    """What the plain Huey task runs."""
    return n


def unique_task(n: int) -> int:
    """What the unique Huey task runs."""
    return n


def _ops(servers: Servers) -> tuple[dict[str, Callable[[], object]], Callable[[], object]]:
    """The three enqueues, and one consumer's run of the next queued task."""
    from uniqjob.integrations.huey import UniqueRedisHuey

    huey = UniqueRedisHuey("bench", url=servers.urls["queue"])
    plain = huey.task()(plain_task)
    unique = huey.task(unique=True, unique_lock_autoexpire=3600)(unique_task)
    unique(-1)  # the lock stays: every duplicate meets it
    ops = {
        "plain": lambda: plain(next(_ids)),
        "unique": lambda: unique(next(_ids)),
        "duplicate": lambda: unique(-1),
    }
    return ops, lambda: huey.execute(huey.dequeue())


def measure(locks_url: str, queue_url: str, *, calls: int = 20) -> dict[str, Trips]:
    """Round trips per call of each path, and per task run by a consumer (``worker``)."""
    servers = Servers(locks_url, queue_url)
    try:
        with _unique_jobs(locks_url):
            ops, work = _ops(servers)
            return _count(servers, ops, work, calls)
    finally:
        servers.close()


def _count(
    servers: Servers, ops: dict[str, Callable[[], object]], work: Callable[[], object], calls: int
) -> dict[str, Trips]:
    for op in ops.values():
        op()  # warm: connections made, scripts loaded
    trips = {path: servers.count(calls, op) for path, op in ops.items()}
    redis.Redis.from_url(servers.urls["queue"]).flushdb()
    for _ in range(calls + 1):
        ops["unique"]()
    work()  # warm
    trips["worker"] = servers.count(calls, work)
    return trips


def run_section(report: Report, locks_url: str, iterations: int, warmup: int) -> None:
    """``python -m benchmarks``'s huey section: Huey's storage on a private redis-server of its own."""
    from tests.redis_server import RedisServer

    with RedisServer() as queue_server:
        servers = Servers(locks_url, queue_server.url)
        ping = redis.Redis.from_url(locks_url)
        try:
            with _unique_jobs(locks_url):
                ops, work = _ops(servers)
                trips = _count(servers, ops, work, 20)
                timed = _timed({"ping": ping.ping, **ops}, iterations, warmup)
        finally:
            ping.close()
            servers.close()
    for path in PATHS:
        t, stats = trips[path], timed[path]
        row = Row(f"huey.{path}", f"huey: {path} enqueue", stats.median_us, stats.p99_us, stats.n)
        row.floor, row.floor_median_us, row.floor_p99_us = (
            "PING",
            timed["ping"].median_us,
            timed["ping"].p99_us,
        )
        row.ratio = stats.median_us / timed["ping"].median_us
        row.extra = {"round trips to the locks": t.locks, "to the queue": t.queue}
        report.rows.append(row)
    plain, unique, dup = trips["plain"], trips["unique"], trips["duplicate"]
    report.figures["huey_worker_lock_trips_per_task"] = trips["worker"].locks
    report.targets += [
        Target(
            "huey.unique.trips",
            f"huey: unique round trips over plain ({plain.total:g})",
            unique.total - plain.total,
            1,
            "",
        ),
        Target(
            "huey.duplicate.trips",
            f"huey: duplicate round trips ({dup.queue:g} to the queue)",
            dup.total,
            1,
            "",
        ),
        Target(
            "huey.worker",
            "huey: consumer round trips to the locks per task (start + finish)",
            trips["worker"].locks,
            2,
            "",
        ),
        Target(
            "huey.unique.extra",
            "huey: (unique - plain enqueue) / duplicate",
            (timed["unique"].median_us - timed["plain"].median_us) / timed["duplicate"].median_us,
            LIMIT,
            "x",
            note=f"unique / plain: {timed['unique'].median_us / timed['plain'].median_us:.2f}x",
        ),
        Target(
            "huey.duplicate.ratio",
            "huey: duplicate / PING",
            timed["duplicate"].median_us / timed["ping"].median_us,
            1.5,
            "x",
        ),
    ]
