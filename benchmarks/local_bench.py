"""The file and memory backends: the same operations, beside a bare FileLock cycle."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from filelock import FileLock

from benchmarks.redis_bench import LABELS, LAYERS
from benchmarks.report import Report, Row, Target
from benchmarks.sampling import Op, interleaved
from benchmarks.workload import Workload
from uniqjob.stores.file import FileBackend
from uniqjob.stores.memory import MemoryBackend

__all__ = ["run_file", "run_memory"]


def run_file(report: Report, directory: Path, iterations: int, warmup: int) -> None:
    """Time the file backend alternately with a bare FileLock acquire+release in the same directory."""
    backend = FileBackend(directory)
    bare = FileLock(directory / "bare.lock")

    def filelock_cycle() -> None:
        bare.acquire()
        bare.release()

    fd = os.open(directory / "flock.lock", os.O_RDWR | os.O_CREAT, 0o600)

    def flock_cycle() -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        fcntl.flock(fd, fcntl.LOCK_UN)

    series: list[tuple[str, str, Op]] = [
        (
            "file.filelock",
            "File · FileLock acquire+release (the floor, timed against itself)",
            filelock_cycle,
        ),
        ("file.flock", "File · flock() on an open file (what FileLock wraps)", flock_cycle),
    ]
    for name, op in Workload(backend).ops().items():
        series.append((f"file.{name}", f"File · {LABELS[name]}", op))
    try:
        results = interleaved([(filelock_cycle, op) for _, _, op in series], iterations, warmup)
    finally:
        os.close(fd)
    for (row_id, label, _), sample in zip(series, results, strict=True):
        report.rows.append(Row.timed(row_id, label, sample, "FileLock"))
    for name, limit in (("duplicate", 2.0), ("cycle", 5.0)):
        for layer, layer_name in LAYERS.items():
            report.targets.append(
                Target(
                    f"file.{layer}.{name}",
                    f"File {name} ({layer_name}) vs FileLock",
                    report.row(f"file.{layer}.{name}").ratio,
                    limit,
                    "x",
                )
            )


def run_memory(report: Report, iterations: int, warmup: int) -> None:
    """Time the memory backend: no floor, the library's own Python cost."""

    def nothing() -> None:
        """Alternated with each operation only to keep the loop the same as elsewhere."""

    ops = Workload(MemoryBackend()).ops()
    results = interleaved([(nothing, op) for op in ops.values()], iterations, warmup)
    for name, sample in zip(ops, results, strict=True):
        report.rows.append(Row.timed(f"memory.{name}", f"Memory · {LABELS[name]}", sample.op))
