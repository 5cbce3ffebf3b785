"""The benchmark command runs end to end and reports every row; never a timed test."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import async_bench
from benchmarks.cli import main
from benchmarks.queues import PATHS, QUEUES
from benchmarks.redis_bench import ACKED, LABELS, PEER_LABELS, PEER_NAMES, peer_missing

ROOT = Path(__file__).resolve().parent.parent

# Every row the report promises, by id.
EXPECTED = (
    ["redis.ping", "redis.evalsha"]
    + [f"redis.{name}" for name in LABELS]
    + [f"peers.{peer}.{name}" for peer in PEER_NAMES for name in PEER_LABELS]
    + [f"replicas.{name}{plain}" for name in ACKED for plain in ("", ".plain")]
    + [f"async.{name}" for name in async_bench.LABELS]
    + ["async.concurrent"]
    + ["parallel.ping", "parallel.joblock.cycle", "parallel.job.cycle"]
    + [f"scale.{n}{e}" for n in LABELS if not n.endswith("cycle") for e in ("", ".empty")]
    + ["file.filelock", "file.flock", *(f"file.{name}" for name in LABELS)]
    + [f"memory.{name}" for name in LABELS]
    + [f"queues.{queue}.{path}" for queue in QUEUES for path in PATHS]
)


def _finite_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow
def test_quick_json_run_has_every_row_with_sane_numbers() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = {row["id"]: row for row in report["rows"]}
    assert sorted(rows) == sorted(EXPECTED)
    for row_id, row in rows.items():
        if row["skipped"]:
            # only an optional peer may be missing, and then it says how to get it
            assert row_id.startswith("peers.redis_lock.") and peer_missing("redis_lock"), row
            assert "pip install" in row["skipped"]
            continue
        assert _finite_positive(row["median_us"]) and row["p99_us"] >= row["median_us"], row
        assert row["n"] >= 1, row
        if row["floor"] is not None:
            assert _finite_positive(row["floor_median_us"]) and _finite_positive(row["ratio"]), row
            assert row["left_behind_us"] is None or row["left_behind_us"] >= 0, row
    for target in report["targets"]:
        assert isinstance(target["met"], bool) and _finite_positive(target["limit"]), target
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
