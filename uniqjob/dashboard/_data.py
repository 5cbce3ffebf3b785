"""What the pages show, read from the store through :mod:`uniqjob.ops`, in memory bounded by the rows shown.

Each listing streams the store's scan once: every key is counted, and only a
bounded number of rows is kept (for the concurrency keys, :func:`uniqjob.ops.concurrency`
keeps the busiest; for the held locks, :func:`uniqjob.dashboard._data.uniqueness` keeps
the orphans and unreadable records first, then the oldest).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from ..errors import CorruptRecordError
from ..locks import holder_is_dead
from ..ops import CORRUPT, KeyReport, LockRow, iter_rows
from ..ops._locks import LockCounts, corrupt_at
from ..stores.base import Backend

__all__ = [
    "CLASSES",
    "DROPS_SHOWN",
    "DROPS_WINDOW",
    "ROWS",
    "TOP",
    "LockConfirm",
    "Uniqueness",
    "blocked",
    "lock_row",
    "uniqueness",
]

#: Concurrency keys listed on the Locks page, busiest first (the totals count every key).
TOP = 100
#: Held locks listed on the Locks page (the counts cover every key).
ROWS = 200
#: The Dropped duplicates card counts the last hour (the longest window the stores keep).
DROPS_WINDOW = 3600
#: Job classes the Dropped duplicates card names, most dropped first.
DROPS_SHOWN = 5
#: Job classes offered in the class filter's suggestions.
CLASSES = 100


@dataclass
class Uniqueness(LockCounts):
    """Counts over every held lock (of the class filtered on), and the rows kept to show."""

    rows: list[LockRow] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)


def _urgent(row: LockRow) -> bool:
    """A row that needs a person: an orphan (reap or release it) or a record that blocks its key."""
    return row.orphaned or row.state == CORRUPT


def uniqueness(backend: Backend, *, job_class: str | None = None, limit: int = ROWS) -> Uniqueness:
    """Count every held lock and keep ``limit`` rows: unreadable and orphaned first, then the oldest."""
    found = Uniqueness()
    urgent: list[LockRow] = []
    oldest: list[tuple[float, int, LockRow]] = []  # a min-heap on age: the youngest kept goes first
    classes: set[str] = set()
    order = itertools.count()
    for row in iter_rows(backend, job_class=job_class):
        found.add(row)
        if row.job_class is not None and len(classes) < CLASSES:
            classes.add(row.job_class)
        if not limit:
            continue
        if _urgent(row):
            if len(urgent) < limit:
                urgent.append(row)
            continue
        item = (row.age_s or 0.0, next(order), row)
        if len(oldest) < limit:
            heapq.heappush(oldest, item)
        else:
            heapq.heappushpop(oldest, item)
    rest = [row for _, _, row in sorted(oldest, key=lambda item: (-item[0], item[1]))]
    urgent.sort(key=lambda row: row.state != CORRUPT)  # unreadable records first: each blocks its key
    found.rows = (urgent + rest)[:limit]
    found.classes = sorted(classes)
    return found


def blocked(row: KeyReport) -> bool:
    """A stale slot next to a parked backlog: jobs wait behind a holder that is gone."""
    return row.stale > 0 and row.parked > 0


@dataclass(frozen=True)
class LockConfirm:
    """One held key as its Release confirmation describes it."""

    row: LockRow
    #: A live holder has its run lock: releasing needs force and its job may still run.
    live: bool


def lock_row(backend: Backend, key: str) -> LockConfirm | None:
    """The held lock ``key`` names (its key, or the path of a record that names none); None if free."""
    try:
        state = backend.read(key)
    except CorruptRecordError as exc:
        return LockConfirm(LockRow.from_corrupt(exc, key), live=False)
    if state.free:
        row = corrupt_at(backend, key)
        return None if row is None else LockConfirm(row, live=False)
    # The test `uniqjob release` applies before it refuses without --force.
    live = state.run is not None and not holder_is_dead(state.run.holder)
    return LockConfirm(LockRow.from_state(state), live=live)
