"""What a run found: timed rows, targets met or not, and how to print them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.sampling import Paired, Stats

__all__ = ["FloorRow", "Report", "Row", "Target"]


@dataclass
class Row:
    """One timed operation: its median and p99, and its ratio to the floor sampled beside it."""

    id: str
    label: str
    median_us: float | None = None
    p99_us: float | None = None
    n: int = 0
    floor: str | None = None  # "PING", "FileLock", or None where no floor applies
    floor_median_us: float | None = None
    floor_p99_us: float | None = None
    ratio: float | None = None  # (median + left behind) / floor median
    left_behind_us: float | None = None  # the floor right after the op, minus the clean floor
    extra: dict[str, float] = field(default_factory=dict)
    skipped: str | None = None

    @classmethod
    def timed(cls, id: str, label: str, sample: Paired | Stats, floor: str | None = None) -> Row:
        """Build a row from an operation's samples; with ``floor``, from its paired samples."""
        if isinstance(sample, Stats):
            return cls(id, label, sample.median_us, sample.p99_us, sample.n)
        op = sample.op
        row = cls(id, label, op.median_us, op.p99_us, op.n)
        if floor is not None:
            row.floor, row.floor_median_us, row.floor_p99_us = (
                floor,
                sample.floor.median_us,
                sample.floor.p99_us,
            )
            row.ratio, row.left_behind_us = sample.ratio, sample.left_behind_us
        return row


@dataclass
class FloorRow:
    """One operation of the Redis section, with one reply parser: against its floor, and a PING.

    The floor is the operation's own commands sent raw (``benchmarks.replay``),
    timed in the same rounds; ``ratio`` is the operation's median over the
    floor's. ``round_trips`` is what ``INFO commandstats`` counted per call.
    """

    id: str
    label: str
    parser: str  # "hiredis" or "python": redis-py's reply parser in that leg
    median_us: float | None = None
    p99_us: float | None = None
    n: int = 0
    floor: str | None = None  # the raw commands, by script name: "CLAIM + START + FINISH"
    floor_median_us: float | None = None
    ratio: float | None = None  # median / floor median
    limit: float | None = None  # the target for ratio; None: information only
    ping_ratio: float | None = None  # median / PING's median, same rounds
    round_trips: float | None = None
    round_trips_target: int | None = None
    python_us: float | None = None  # what the operation adds to its floor with no I/O: its Python
    skipped: str | None = None
    met: bool | None = None  # ratio within limit; None: no target, or not measured

    def __post_init__(self) -> None:
        if self.met is None and self.limit is not None and self.ratio is not None:
            self.met = self.ratio <= self.limit


@dataclass
class Target:
    """A goal from the issue: ``value`` against ``limit`` (lower is better)."""

    id: str
    label: str
    value: float | None
    limit: float
    unit: str
    met: bool | None = None  # None: not measured (a peer that is not installed)
    note: str = ""

    def __post_init__(self) -> None:
        if self.met is None and self.value is not None:
            self.met = self.value <= self.limit


@dataclass
class Report:
    """Everything one run measured."""

    meta: dict[str, Any] = field(default_factory=dict)
    floor_rows: list[FloorRow] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)

    def row(self, id: str) -> Row:
        """Return the row called ``id``."""
        for row in self.rows:
            if row.id == id:
                return row
        raise KeyError(f"no benchmark row {id!r}")

    def to_json(self) -> str:
        """Return the report as JSON."""
        return json.dumps(asdict(self), indent=2, allow_nan=False)

    def to_text(self) -> str:
        """Return the report as tables for a terminal (or a README)."""
        lines = ["uniqjob benchmark — " + ", ".join(f"{k}: {v}" for k, v in self.meta.items()), ""]
        if self.floor_rows:
            lines += [*floor_table(self.floor_rows), ""]
        if self.rows:
            lines += [
                "| operation | median µs | p99 µs | left behind µs | x floor | floor (median µs) |",
                "| --- | ---: | ---: | ---: | ---: | --- |",
            ]
        for r in self.rows:
            if r.skipped:
                lines.append(f"| {r.label} | — | — | — | — | skipped: {r.skipped} |")
                continue
            ratio = "—" if r.ratio is None else f"{r.ratio:.2f}"
            floor = "—" if r.floor is None else f"{r.floor} ({r.floor_median_us:.1f})"
            left = "—" if r.left_behind_us is None else f"{r.left_behind_us:.1f}"
            extra = "".join(f", {k} {v:,.0f}" for k, v in r.extra.items())
            lines.append(
                f"| {r.label} | {r.median_us:.1f} | {r.p99_us:.1f} | {left} | {ratio} | {floor}{extra} |"
            )
        if self.rows:
            lines.append("")
        lines += ["| target | measured | limit | met |", "| --- | ---: | ---: | --- |"]
        for t in self.targets:
            value = "—" if t.value is None else _fmt(t.value, t.unit)
            met = {True: "met", False: "NOT MET", None: "not measured"}[t.met]
            note = f" ({t.note})" if t.note else ""
            lines.append(f"| {t.label}{note} | {value} | {_fmt(t.limit, t.unit)} | {met} |")
        met_count = sum(t.met is True for t in self.targets)
        lines += ["", f"{met_count} of {len(self.targets)} targets met."]
        return "\n".join(lines)


def floor_table(rows: list[FloorRow]) -> list[str]:
    """The Redis section's table: each operation against its floor, per parser."""
    lines = [
        "Redis: each operation against its floor (its own Lua scripts, same arguments, sent by "
        "client.evalsha), in the same rounds",
        "",
        "| operation | parser | median µs | floor µs | x floor | target | met | round trips (target) "
        "| x PING | Python µs | floor: the raw calls |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        if r.skipped:
            lines.append(f"| {r.label} | {r.parser} | — | — | — | — | — | — | — | — | skipped: {r.skipped} |")
            continue
        floor_us = "—" if r.floor_median_us is None else f"{r.floor_median_us:.1f}"
        ratio = "—" if r.ratio is None else f"{r.ratio:.3f}"  # three places: 1.352 is not met at 1.35
        limit = "—" if r.limit is None else f"≤ {r.limit:.2f}"
        met = {True: "met", False: "NOT MET", None: "—"}[r.met]
        trips = "—" if r.round_trips is None else f"{r.round_trips:g}"
        if r.round_trips_target is not None:
            trips += f" ({r.round_trips_target})"
        ping = "—" if r.ping_ratio is None else f"{r.ping_ratio:.2f}"
        python = "—" if r.python_us is None else f"{r.python_us:.1f}"
        lines.append(
            f"| {r.label} | {r.parser} | {r.median_us:.1f} | {floor_us} | {ratio} | {limit} | {met} "
            f"| {trips} | {ping} | {python} | {r.floor or '—'} |"
        )
    return lines


def _fmt(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value:+.1f}%"
    if unit == " round trips":
        return f"{value:g}{unit}"
    if unit == "B":
        return f"{value:.0f} B"
    return f"{value:.3f}{unit}" if unit == "x" else f"{value:.2f}{unit}"
