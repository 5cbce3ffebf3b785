"""Dropped duplicates per job class, in minute buckets of the store's clock, kept an hour and a bucket.

The Python stores keep them in a JSON-ready dict, ``{class: {minute: count}}``
(a minute is ``floor(time / 60)`` of the store's clock, as text), changed
under the same mutual exclusion as the refusal it counts; the Redis store
keeps the same buckets in Lua (``_lua.TALLY``). Reading sums the buckets
that overlap the window asked for.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigurationError

__all__ = ["BUCKET", "KEEP", "WINDOW", "Counts", "add", "check_window", "first_minute", "minute", "totals"]

#: Seconds per bucket.
BUCKET = 60
#: The longest window a store answers for, in seconds (the default).
WINDOW = 3600.0
#: Seconds a count is kept: the window and the bucket it began in.
KEEP = int(WINDOW) + BUCKET

#: ``{class: {minute: count}}``.
Counts = dict[str, dict[str, int]]


def minute(now: float) -> int:
    """The bucket of store time ``now`` (seconds)."""
    return math.floor(now / BUCKET)


def check_window(window: float) -> float:
    """``window`` as seconds, if a store can answer for it (0 < window <= WINDOW); else ConfigurationError."""
    if isinstance(window, bool) or not isinstance(window, int | float) or not 0 < window <= WINDOW:
        raise ConfigurationError(
            f"the window of dropped duplicates must be a number of seconds > 0 and <= {WINDOW:g} "
            f"(the stores keep counts for an hour), got {window!r}"
        )
    return float(window)


def first_minute(now: float, window: float) -> int:
    """The oldest bucket that overlaps the ``window`` seconds before ``now``."""
    return minute(now - check_window(window))


def add(counts: Counts, cls: str, now: float, n: int = 1) -> None:
    """Add ``n`` (-1: take one back, never below 0) to ``cls``'s bucket of ``now``.

    The first count of a bucket also drops every class's buckets past KEEP:
    until the minute turns, nothing more can have aged out.
    """
    if not cls:
        return  # a call whose class the store was not told: nothing to attribute it to
    m = minute(now)
    bucket = str(m)
    buckets = counts.get(cls)
    if buckets is None or bucket not in buckets:
        _sweep(counts, m - KEEP // BUCKET)
        buckets = counts.setdefault(cls, {})
    value = buckets.get(bucket, 0) + n
    if value > 0:
        buckets[bucket] = value
    else:
        buckets.pop(bucket, None)
        if not buckets:
            del counts[cls]


def _sweep(counts: Counts, oldest: int) -> None:
    """Drop the buckets before minute ``oldest``, and the classes left with none."""
    for name in list(counts):
        buckets = counts[name]
        for b in [b for b in buckets if int(b) < oldest]:
            del buckets[b]
        if not buckets:
            del counts[name]


def totals(counts: Any, now: float, window: float) -> dict[str, int]:
    """The sum per class of the buckets of ``counts`` that overlap the ``window`` seconds before ``now``."""
    first = first_minute(now, window)
    out: dict[str, int] = {}
    for cls, buckets in counts.items():
        total = sum(n for b, n in buckets.items() if int(b) >= first)
        if total:
            out[cls] = total
    return out
