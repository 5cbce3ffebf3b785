"""The Redis section: what uniqjob's Python adds to the client calls it must make.

Each operation is timed beside its floor — the same Lua scripts with the same
arguments, sent straight by ``client.evalsha`` (recorded from the operation
itself: ``benchmarks.replay``) — in the same rounds, so machine noise hits
both alike; PING and the peers (redis-py's ``Lock``, python-redis-lock) run in
those rounds too, as information. Round trips are counted with
``INFO commandstats`` on the benchmark's own redis-server.

The section runs once per reply parser, each leg in a process of its own
(``python -m benchmarks.redis_leg``): with hiredis (where it is installed;
redis-py then uses it by itself) and with redis-py's Python parser (hiredis
blocked in that process before redis-py is imported).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import redis

from benchmarks.peers import PEER_LABELS, PEER_NAMES, peer_missing, peer_ops
from benchmarks.replay import Raw, python_cost, record, round_trips, script_names
from benchmarks.report import FloorRow, Report, Target
from benchmarks.sampling import Op, rounds
from benchmarks.workload import Workload
from uniqjob.stores.redis import RedisBackend

__all__ = ["OPS", "PARSERS", "ROW_IDS", "leg", "run_section"]

ROOT = Path(__file__).resolve().parent.parent


class Spec(NamedTuple):
    label: str
    limit: float | None  # target for the ratio to the floor; None: information
    trips: int  # the round trips it should take (issue 21: one per state change)
    fresh: bool  # takes a key nobody holds (its floor then takes a fresh key too)


#: uniqjob's operations (benchmarks.workload's names), in the table's order.
OPS: dict[str, Spec] = {
    "joblock.fresh": Spec("JobLock.acquire(), a free key", 1.2, 1, True),
    "joblock.duplicate": Spec("JobLock.acquire(), a queued key: rejected", 1.2, 1, False),
    "job.fresh": Spec("UniqueJob.enqueue(), a new call", 1.35, 1, True),
    "job.duplicate": Spec("UniqueJob.enqueue(), a queued call: dropped", 1.35, 1, False),
    "job.keep_last": Spec("UniqueJob.enqueue(), keep_last, a queued call: coalesced", 1.35, 1, False),
    "job.debounce": Spec("UniqueJob.enqueue(), debounce, a queued call: pushed back", 1.35, 1, False),
    "job.cycle": Spec("UniqueJob full cycle: enqueue → perform → release", 1.35, 3, True),
    "joblock.cycle": Spec("JobLock cycle: acquire → running() → release", None, 3, True),
}
PARSERS = ("hiredis", "python")
#: Every row id of the section (each once per parser).
ROW_IDS = [
    "redis.ping",
    *(f"redis.{name}" for name in OPS),
    *(f"peers.{peer}.{name}" for peer in PEER_NAMES for name in PEER_LABELS),
]


def _settle(returned: object) -> None:
    if callable(returned):
        returned()


def leg(url: str, iterations: int, warmup: int, counted: int) -> dict[str, Any]:
    """Time the section with this process's parser; its rows as dicts, and that parser."""
    client = redis.Redis.from_url(url)
    parser = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "python"
    names = script_names()
    # (row id, label, op, its raw replay, its spec); PING first: its own group, its own raw.
    timed: list[tuple[str, str, Op, Raw, Spec | None]] = []
    skipped: list[FloorRow] = []

    def add(row_id: str, label: str, op: Op, spec: Spec | None, fresh: bool) -> None:
        for _ in range(3):  # scripts loaded, connection made, caches warm: nothing sent once only
            _settle(op())
        sent, returned = record(client, op)
        _settle(returned)
        raw = Raw(client, sent, fresh=fresh)
        raw.check()
        timed.append((row_id, label, op, raw, spec))

    add("redis.ping", "PING", client.ping, None, False)
    ops = Workload(RedisBackend(client, namespace=f"floor-{parser}")).ops()
    for name, op_spec in OPS.items():
        add(f"redis.{name}", op_spec.label, ops[name], op_spec, op_spec.fresh)
    for peer, peer_name in PEER_NAMES.items():
        missing = peer_missing(peer)
        its = {} if missing else peer_ops(client, peer)
        for name, label in PEER_LABELS.items():
            row_id, row_label = f"peers.{peer}.{name}", f"{peer_name}: {label}"
            if missing:
                skipped.append(FloorRow(row_id, row_label, parser, skipped=missing))
            else:
                add(row_id, row_label, its[name], None, name != "acquire_held")

    # Ours with their floor, back to back; PING and the peers alone.
    groups: list[list[Op]] = [[raw.op(), op] if spec else [op] for _, _, op, raw, spec in timed]
    results = rounds(groups, iterations, warmup)
    ping = results[0][0]
    rows: list[FloorRow] = []
    for (row_id, label, op, raw, spec), stats in zip(timed, results, strict=True):
        mine = stats[-1]
        floor = stats[0] if spec else None
        rows.append(
            FloorRow(
                row_id,
                label,
                parser,
                mine.median_us,
                mine.p99_us,
                mine.n,
                floor=raw.describe(names) if spec else None,
                floor_median_us=floor.median_us if floor else None,
                ratio=mine.median_us / floor.median_us if floor else None,
                limit=spec.limit if spec else None,
                ping_ratio=mine.median_us / ping.median_us,
                round_trips=round_trips(client, op, raw, counted),
                round_trips_target=spec.trips if spec else None,
                python_us=python_cost(client, op, raw, max(200, iterations)) if spec else None,
            )
        )
    client.close()
    return {"parser": parser, "rows": [asdict(r) for r in rows + skipped]}


def run_section(
    report: Report,
    client: redis.Redis,
    url: str,
    *,
    iterations: int,
    warmup: int,
    counted: int,
    progress: Callable[[str], None],
) -> None:
    """Run a leg per parser (each a process of its own, on ``url``); its rows and targets into ``report``."""
    legs: dict[str, list[FloorRow]] = {}
    for parser in PARSERS:
        if parser == "hiredis" and not redis.utils.HIREDIS_AVAILABLE:
            why = (
                "hiredis is not installed (pip install -e '.[hiredis]')"
                if importlib.util.find_spec("hiredis") is None
                else "redis-py does not use the hiredis installed (pip install -e '.[hiredis]')"
            )
            specs = {f"redis.{name}": spec for name, spec in OPS.items()}
            legs[parser] = [
                FloorRow(
                    row_id,
                    row_id,
                    parser,
                    limit=specs[row_id].limit if row_id in specs else None,
                    round_trips_target=specs[row_id].trips if row_id in specs else None,
                    skipped=why,
                )
                for row_id in ROW_IDS
            ]
            continue
        progress(f"redis, {parser} parser: {iterations} rounds")
        client.flushall()
        command = [sys.executable, "-m", "benchmarks.redis_leg", url, str(iterations), str(warmup)]
        command += [str(counted)] + (["--no-hiredis"] if parser == "python" else [])
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the Redis section's {parser} leg failed:\n{done.stderr}")
        answer = json.loads(done.stdout)
        if answer["parser"] != parser:
            raise RuntimeError(f"the {parser} leg ran with redis-py's {answer['parser']} parser")
        legs[parser] = [FloorRow(**row) for row in answer["rows"]]
    client.flushall()
    by_id = {(r.id, r.parser): r for rows in legs.values() for r in rows}
    labels = {r.id: r.label for r in by_id.values() if not r.skipped}
    for row_id in ROW_IDS:
        for parser in PARSERS:
            row = by_id[row_id, parser]
            row.label = labels.get(row_id, row.label)
            report.floor_rows.append(row)
    trips_counted = False
    for parser in PARSERS:
        mine = [by_id[f"redis.{name}", parser] for name in OPS]
        for row in mine:
            if row.limit is not None:
                report.targets.append(
                    Target(
                        f"{row.id}.{parser}",
                        f"Redis {row.label} ({parser}) vs its raw calls",
                        row.ratio,
                        row.limit,
                        "x",
                    )
                )
        plain = by_id["redis.job.duplicate", parser]
        for row in (by_id["redis.job.keep_last", parser], by_id["redis.job.debounce", parser]):
            if row.median_us and plain.median_us:  # issue 24: a coalesced duplicate costs about a plain one
                ratio = row.median_us / plain.median_us
                label = f"Redis {row.label} ({parser}) vs a plain duplicate"
                report.targets.append(Target(f"{row.id}.vs_duplicate.{parser}", label, ratio, 1.5, "x"))
        if not trips_counted and not mine[0].skipped:  # the same with either parser: counted once
            trips_counted = True
            for row in mine:
                assert row.round_trips_target is not None
                report.targets.append(
                    Target(
                        f"{row.id}.round_trips",
                        f"Redis {row.label}: round trips",
                        row.round_trips,
                        row.round_trips_target,
                        " round trips",
                    )
                )
