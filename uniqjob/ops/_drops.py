"""Dropped duplicates, and the store's figures in one read: what ``uniqjob stats`` and the metrics show."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .. import config
from ..locks import QUEUED, RUNNING
from ..stores._drops import WINDOW
from ..stores.base import Backend
from ._figures import Totals, concurrency
from ._locks import CORRUPT, class_matches, iter_rows

__all__ = ["Stats", "duplicates", "stats"]


def duplicates(
    store: Backend | None = None, *, window: float = WINDOW, job_class: str | None = None
) -> dict[str, int]:
    """Return the duplicates dropped, rescheduled or raised per job class over the last ``window`` seconds.

    The counts are the store's (every process's calls), busiest class first;
    ``window`` is at most 3600 (see :meth:`uniqjob.stores.base.Backend.duplicates`).
    ``job_class`` keeps one class (full name, or its last dotted part).
    """
    backend = store if store is not None else config.default_backend()
    counts = backend.duplicates(window)
    if job_class is not None:
        counts = {cls: n for cls, n in counts.items() if class_matches(cls, job_class)}
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


@dataclass(frozen=True, slots=True)
class Stats:
    """A store's figures over every key: its locks, its concurrency totals and its dropped duplicates."""

    queued: int
    running: int
    orphaned: int
    corrupt: int
    concurrency: Totals
    duplicates: dict[str, int]
    window: float

    def to_json(self) -> dict[str, object]:
        """Return the figures as the JSON object ``uniqjob stats --json`` prints."""
        return {
            "locks": {
                "queued": self.queued,
                "running": self.running,
                "orphaned": self.orphaned,
                "corrupt": self.corrupt,
            },
            "concurrency": self.concurrency.to_json(),
            "duplicates": self.duplicates,
            "window_s": self.window,
        }


def stats(store: Backend | None = None, *, window: float = WINDOW) -> Stats:
    """Read ``store``'s figures (None: the configured store): every lock and concurrency key, streaming."""
    backend = store if store is not None else config.default_backend()
    drops = duplicates(backend, window=window)  # first: a bad window fails before the scans
    states: Counter[str] = Counter()
    orphans = 0
    for row in iter_rows(backend):
        states[QUEUED if row.waiting else row.state] += 1
        orphans += row.orphaned
    totals = concurrency(backend, top=0).totals
    return Stats(states[QUEUED], states[RUNNING], orphans, states[CORRUPT], totals, drops, float(window))
