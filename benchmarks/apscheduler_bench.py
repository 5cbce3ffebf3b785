"""APScheduler: a job call, plain and under ``once_per_tick``, and a tick another host already ran.

What an APScheduler executor calls, timed in this process on the section's
redis-server: the plain function; the wrapped one in a tick nobody ran yet (a
run: the tick's lock, the run lock, the release; a new argument each call, so a
new key, as a new tick is); and the wrapped one in a tick that already ran (a
dropped duplicate). Round trips are the server's read events (``INFO stats``
``total_reads_processed``), less the ``INFO`` that asks, over a few calls made
just after the store's clock was read (it is read once a minute). The targets:
a refused tick is one round trip to the lock store, and costs within 1.1x a
``@unique`` function's dropped duplicate (the same lock, an expiry fixed: what
``once_per_tick`` adds is its tick's arithmetic).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import redis

import uniqjob
from benchmarks.report import Report, Row, Target
from benchmarks.sampling import Stats, summarize
from uniqjob import unique
from uniqjob.integrations.apscheduler import once_per_tick

__all__ = ["run_section"]

#: What each path calls, in report order.
PATHS = {
    "plain": "plain job call",
    "duplicate": "@unique (until_expired): a duplicate (dropped)",
    "run": "once_per_tick: a tick nobody ran (runs)",
    "refused": "once_per_tick: a tick another host ran (dropped)",
}


def job(n: int) -> int:
    """The job: as cheap as a job gets, so that what is measured is the wrapper."""
    return n


#: The job under once_per_tick: ticks of a day, so every call of the section is in one tick.
unique_job = once_per_tick("1d")(job)
#: The yardstick of a refused tick: a ``@unique`` function's dropped duplicate, the same lock shape.
plain_unique = unique(strategy="until_expired", lock_autoexpire=86400)(job)


def _trips(client: redis.Redis, calls: int, op: Callable[[], object]) -> float:
    """Round trips to the server per call of ``op``."""
    before = int(client.info("stats")["total_reads_processed"])
    for _ in range(calls):
        op()
    return (int(client.info("stats")["total_reads_processed"]) - before - 1) / calls


def _timed(ops: dict[str, Callable[[], object]], iterations: int, warmup: int) -> dict[str, Stats]:
    """Median and p99 of each op, called in turn (one sample of each per round)."""
    samples: dict[str, list[int]] = {name: [] for name in ops}
    for i in range(warmup + iterations):
        for name, op in ops.items():
            began = time.perf_counter_ns()
            op()
            if i >= warmup:
                samples[name].append(time.perf_counter_ns() - began)
    return {name: summarize(s) for name, s in samples.items()}


def run_section(report: Report, url: str, iterations: int, warmup: int, counted: int = 20) -> None:
    """The apscheduler section: rows of times and round trips, and the targets, into ``report``."""
    client = redis.Redis.from_url(url)
    uniqjob.configure(url)
    fresh = itertools.count(1)
    try:
        unique_job(0)  # the tick of key 0 runs: every later call of it is refused
        plain_unique(0)
        ops: dict[str, Callable[[], object]] = {
            "plain": lambda: job(0),
            "duplicate": lambda: plain_unique(0),
            "run": lambda: unique_job(next(fresh)),
            "refused": lambda: unique_job(0),
        }
        trips = {name: _trips(client, counted, op) for name, op in ops.items()}
        # A run leaves its heartbeat thread ending: timed apart, so as not to slow the call after it.
        timed = _timed(
            {"ping": client.ping, **{k: ops[k] for k in ("plain", "duplicate", "refused")}},
            iterations,
            warmup,
        )
        timed["run"] = _timed({"run": ops["run"]}, iterations, warmup)["run"]
    finally:
        uniqjob.configure(None)
        client.close()
    ping = timed["ping"]
    for name, label in PATHS.items():
        stats = timed[name]
        row = Row(f"apscheduler.{name}", label, stats.median_us, stats.p99_us, stats.n)
        row.floor, row.floor_median_us, row.floor_p99_us = "PING", ping.median_us, ping.p99_us
        row.ratio = stats.median_us / ping.median_us
        row.extra = {"round trips to the locks": trips[name]}
        report.rows.append(row)
    report.targets += [
        Target(
            "apscheduler.refused.trips", "apscheduler: a refused tick's round trips", trips["refused"], 1, ""
        ),
        Target(
            "apscheduler.run.trips",
            "apscheduler: a run's round trips (take, start, release)",
            trips["run"],
            3,
            "",
        ),
        Target(
            "apscheduler.refused.ratio",
            "apscheduler: a refused tick / a @unique duplicate",
            timed["refused"].median_us / timed["duplicate"].median_us,
            1.1,
            "x",
        ),
    ]
