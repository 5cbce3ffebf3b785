"""Throughput with several processes at once: PING against full job cycles.

Every process starts at one shared instant (``time.monotonic`` is system-wide on
Linux), runs its share and reports when it began and ended; the phase's time is
first start to last end. PING and cycle phases alternate over a few rounds and
each round's ratio is taken, so the machine's drift hits both alike.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from typing import Any

from benchmarks.report import Report, Row

__all__ = ["KINDS", "run_parallel"]

KINDS = {
    "joblock.cycle": "full cycle · JobLock acquire, running(), release",
    "job.cycle": "full cycle · enqueue, then lock_from() + execute()",
}

_state: dict[str, Any] = {}


def _worker(task: tuple[str, str, int, float]) -> tuple[float, float]:
    """Run ``count`` operations of ``kind`` from ``start_at`` on; return (began, ended)."""
    kind, url, count, start_at = task
    import os

    import redis

    from benchmarks.workload import Workload
    from uniqjob.stores.redis import RedisBackend

    if _state.get("url") != url:
        client = redis.Redis.from_url(url)
        _state.update(url=url, client=client)
        # Each process its own key space: the ids start at its pid, far apart.
        _state["work"] = Workload(RedisBackend(client, namespace="par"), first_id=os.getpid() * 10**7)
    client, work = _state["client"], _state["work"]
    op = client.ping if kind == "ping" else work.ops()[kind]
    op()  # the connection is up before the clock starts
    delay = start_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    began = time.monotonic()
    for _ in range(count):
        op()
    return began, time.monotonic()


def _phase(pool: Any, processes: int, kind: str, url: str, count: int) -> float:
    """Return microseconds of wall time per operation, all processes together."""
    start_at = time.monotonic() + 0.2
    spans: list[tuple[float, float]] = pool.map(
        _worker, [(kind, url, count, start_at)] * processes, chunksize=1
    )
    wall = max(end for _, end in spans) - min(begin for begin, _ in spans)
    return wall * 1e6 / (count * processes)


def run_parallel(report: Report, url: str, processes: int, count: int, rounds: int) -> None:
    """Time PING and the full cycles from ``processes`` processes at once."""
    results: dict[str, list[float]] = {"ping": [], **{kind: [] for kind in KINDS}}
    ratios: dict[str, list[float]] = {kind: [] for kind in KINDS}
    # spawn, not fork: the parent has a heartbeat thread and open connections.
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        pool.map(_worker, [("ping", url, 1, 0.0)] * processes, chunksize=1)  # every process imported
        for _ in range(rounds):
            for kind in KINDS:
                ping = _phase(pool, processes, "ping", url, count * 3)
                cycle = _phase(pool, processes, kind, url, count)
                results["ping"].append(ping)
                results[kind].append(cycle)
                ratios[kind].append(cycle / ping)
    ping_us = statistics.median(results["ping"])
    report.rows.append(
        Row(
            "parallel.ping",
            f"{processes} processes · PING",
            ping_us,
            max(results["ping"]),
            len(results["ping"]),
            extra={"ops/s": 1e6 / ping_us},
        )
    )
    for kind, label in KINDS.items():
        us = statistics.median(results[kind])
        ratio = statistics.median(ratios[kind])
        report.rows.append(
            Row(
                f"parallel.{kind}",
                f"{processes} processes · {label}",
                us,
                max(results[kind]),
                len(results[kind]),
                floor="PING",
                floor_median_us=ping_us,
                floor_p99_us=max(results["ping"]),
                ratio=ratio,
                extra={"ops/s": 1e6 / us},
            )
        )
