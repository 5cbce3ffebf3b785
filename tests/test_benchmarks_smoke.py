"""The benchmark command runs end to end and reports every row; never a timed test."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis.utils

from benchmarks import apscheduler_bench, async_bench
from benchmarks.cli import main
from benchmarks.peers import peer_missing
from benchmarks.queues import PATHS, QUEUES
from benchmarks.redis_bench import ACKED, LABELS, SCALED
from benchmarks.redis_floor import OPS, PARSERS, ROW_IDS

ROOT = Path(__file__).resolve().parent.parent

# Every row of the general table, by id (the Redis section's are ROW_IDS, once per parser).
EXPECTED = (
    [f"replicas.{name}{plain}" for name in ACKED for plain in ("", ".plain")]
    + [f"async.{name}" for name in async_bench.LABELS]
    + ["async.concurrent"]
    + ["parallel.ping", "parallel.joblock.cycle", "parallel.job.cycle"]
    + [f"scale.{n}{e}" for n in SCALED for e in ("", ".empty")]
    + ["file.filelock", "file.flock", *(f"file.{name}" for name in LABELS)]
    + [f"memory.{name}" for name in LABELS]
    + [f"queues.{queue}.{path}" for queue in QUEUES for path in (*PATHS, "claim")]
    + [f"apscheduler.{path}" for path in apscheduler_bench.PATHS]
    + [f"huey.{path}" for path in PATHS]
    + [f"django.{backend}.{path}" for backend in ("db", "rq") for path in PATHS]
)


def _finite_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _run(*argv: str, timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *argv, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _check_floor_rows(report: dict[str, Any]) -> None:
    """The Redis section's table: every operation once per parser, timed beside its floor, round trips
    counted. Round trips do not depend on the machine, so they are checked exactly."""
    rows = {(row["id"], row["parser"]): row for row in report["floor_rows"]}
    assert sorted(rows) == sorted((row_id, parser) for row_id in ROW_IDS for parser in PARSERS)
    for (row_id, parser), row in rows.items():
        if row["skipped"]:
            # only an optional package may be missing, and then the row says how to get it
            missing_hiredis = parser == "hiredis" and not redis.utils.HIREDIS_AVAILABLE
            missing_peer = row_id.startswith("peers.redis_lock.") and peer_missing("redis_lock")
            assert missing_hiredis or missing_peer, row
            assert "pip install" in row["skipped"], row
            continue
        assert _finite_positive(row["median_us"]) and row["p99_us"] >= row["median_us"], row
        assert _finite_positive(row["ping_ratio"]), row
        if row_id == "redis.ping":
            assert row["round_trips"] == 1 and row["ping_ratio"] == 1.0, row
            continue
        if row_id.startswith("peers."):
            assert row["round_trips"] >= 1 and row["floor"] is None, row
            continue
        spec = OPS[row_id.removeprefix("redis.")]
        # ours: the floor is the same scripts, sent raw in the same rounds
        assert row["floor"] == {1: "CLAIM", 3: "CLAIM + START + FINISH"}[spec.trips], row
        assert _finite_positive(row["floor_median_us"]), row
        assert row["ratio"] == pytest.approx(row["median_us"] / row["floor_median_us"]), row
        assert row["limit"] == spec.limit and row["met"] == (
            None if spec.limit is None else row["ratio"] <= spec.limit
        ), row
        # one round trip per state change: 1 for an enqueue or a duplicate, 3 for a full cycle
        assert row["round_trips"] == spec.trips == row["round_trips_target"], row
    # a row of redis-py's own Lock: its acquire is one SET, its release one script
    if not rows["peers.redis_py.cycle", "python"]["skipped"]:
        assert rows["peers.redis_py.acquire", "python"]["round_trips"] == 1
        assert rows["peers.redis_py.cycle", "python"]["round_trips"] == 2


def test_quick_redis_section_counts_round_trips_and_times_each_row_beside_its_floor() -> None:
    report = _run("--only", "redis", "--iterations", "20", "--warmup", "2", "--counted", "3", timeout=120)
    _check_floor_rows(report)
    assert report["rows"] == []
    targets = {target["id"]: target for target in report["targets"]}
    for name, spec in OPS.items():
        trips = targets[f"redis.{name}.round_trips"]
        assert trips["met"] is True and trips["value"] == spec.trips, trips
        for parser in PARSERS:
            if spec.limit is not None:
                assert targets[f"redis.{name}.{parser}"]["limit"] == spec.limit
    for target in report["targets"]:
        if target["value"] is not None:
            assert target["met"] == (target["value"] <= target["limit"]), target


@pytest.mark.slow
def test_quick_json_run_has_every_row_with_sane_numbers() -> None:
    report = _run("--quick", timeout=240)
    _check_floor_rows(report)
    rows = {row["id"]: row for row in report["rows"]}
    assert sorted(rows) == sorted(EXPECTED)
    for row in rows.values():
        assert not row["skipped"], row
        assert _finite_positive(row["median_us"]) and row["p99_us"] >= row["median_us"], row
        assert row["n"] >= 1, row
        if row["floor"] is not None:
            assert _finite_positive(row["floor_median_us"]) and _finite_positive(row["ratio"]), row
            assert row["left_behind_us"] is None or row["left_behind_us"] >= 0, row
    for target in report["targets"]:
        assert _finite_positive(target["limit"]), target
        if target["value"] is not None:  # None: a leg whose parser is not installed
            assert target["met"] == (target["value"] <= target["limit"]), target
    figures = report["figures"]
    assert figures["held_locks"] == 2000
    assert 50 < figures["redis_bytes_per_queued_lock"] < 5000
    assert figures["redis_bytes_per_running_job"] > figures["redis_bytes_per_queued_lock"]
    # 1,000 calls on 100 keys: each key runs at least once a round, never all of its calls at once
    assert figures["async_concurrent_calls_per_s"] > 0
    assert async_bench.KEYS <= figures["async_concurrent_ran"] < async_bench.CALLS


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--iterations", "0"], "--iterations: must be at least 1, got 0"),
        (["--held", "many"], "--held: expected a whole number, got 'many'"),
        (["--only", "redis,disk"], "--only: unknown section disk"),
        (["--warmup", "-1"], "--warmup: must be at least 0, got -1"),
    ],
)
def test_bad_options_name_the_problem(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
