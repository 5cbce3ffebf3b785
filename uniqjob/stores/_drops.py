"""Refused calls per job class and kind, in minute buckets of the store's clock, kept an hour and a bucket.

A refused call is one of three kinds (:data:`KINDS`): dropped (the policy dropped,
rescheduled or raised it), coalesced (a "keep_last" or debounced call whose
arguments the queued or pending call took over) or replaced (a "replace" call
that took a queued call's place). The Python stores keep them in a JSON-ready
dict, ``{class: {bucket: count}}``, a bucket being the minute (``floor(time / 60)``
of the store's clock, as text) followed by the kind's letter ("" dropped, "c"
coalesced, "r" replaced), changed under the same mutual exclusion as the refusal
it counts; the Redis store keeps the same buckets in Lua (``_lua.count_drop``).
Reading sums the buckets that overlap the window asked for.
"""

from __future__ import annotations

import math

from ..errors import ConfigurationError

__all__ = [
    "BUCKET", "KEEP", "KINDS", "WINDOW", "Counts", "Tally", "add", "bucket_minute", "check_window",
    "first_minute", "kind_of", "minute", "tally",
]  # fmt: skip

#: Seconds per bucket.
BUCKET = 60
#: The longest window a store answers for, in seconds (the default).
WINDOW = 3600.0
#: Seconds a count is kept: the window and the bucket it began in.
KEEP = int(WINDOW) + BUCKET

#: ``{class: {minute + kind letter: count}}``.
Counts = dict[str, dict[str, int]]
#: ``{kind: {class: count}}``, every kind of :data:`KINDS` present: what ``Backend.drops`` returns.
Tally = dict[str, dict[str, int]]
#: A kind's letter in a bucket -> its name in a :data:`Tally` (``uniqjob stats --json``'s fields).
KINDS = {"": "duplicates", "c": "coalesced", "r": "replaced"}


def kind_of(coalesced: str) -> str:
    """The kind letter of a refusal whose ``LockState.coalesced`` is ``coalesced``."""
    return {"latest": "c", "pending": "c", "replaced": "r"}.get(coalesced, "")


def bucket_minute(bucket: str) -> int | None:
    """The minute of ``bucket`` (its kind letter cut off), None if it names none."""
    m = bucket.rstrip("cr")
    return int(m) if m.isdigit() else None


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


def add(counts: Counts, cls: str, now: float, n: int = 1, kind: str = "") -> None:
    """Add ``n`` (-1: take one back, never below 0) to ``cls``'s bucket of ``now`` and ``kind`` (a letter).

    A count taken back from a bucket that holds none comes off another kind's of that minute
    (the refusal a retry resolved was coalesced, say). The first count of a bucket also drops
    every class's buckets past KEEP: until the minute turns, nothing more can have aged out.
    """
    if not cls:
        return  # a call whose class the store was not told: nothing to attribute it to
    m = minute(now)
    bucket = f"{m}{kind}"
    buckets = counts.get(cls)
    if n < 0 and buckets is not None and bucket not in buckets:
        bucket = next((f"{m}{k}" for k in KINDS if f"{m}{k}" in buckets), bucket)
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
        for b in [b for b in buckets if (bucket_minute(b) or 0) < oldest]:
            del buckets[b]
        if not buckets:
            del counts[name]


def tally(counts: Counts, first: int, into: Tally | None = None) -> Tally:
    """The sum per kind and class of the buckets of ``counts`` from minute ``first`` on (see
    :func:`first_minute`), added to ``into`` (a new :data:`Tally` if None)."""
    out = into if into is not None else {name: {} for name in KINDS.values()}
    for cls, buckets in counts.items():
        for b, n in buckets.items():
            m = bucket_minute(b)
            kind = KINDS.get(b[len(str(m)) :]) if m is not None and m >= first and n > 0 else None
            if kind is not None:
                out[kind][cls] = out[kind].get(cls, 0) + n
    return out
