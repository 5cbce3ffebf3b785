"""Dropped duplicates, and the store's figures in one read: what ``uniqjob stats`` and the metrics show."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import config
from ..stores._drops import WINDOW
from ..stores.base import Backend
from ._figures import Totals, concurrency
from ._locks import LockCounts, class_matches, iter_rows

__all__ = ["Stats", "drops", "duplicates", "stats"]


def duplicates(
    store: Backend | None = None, *, window: float = WINDOW, job_class: str | None = None
) -> dict[str, int]:
    """Return the duplicates dropped, rescheduled or raised per job class over the last ``window`` seconds.

    The counts are the store's (every process's calls), busiest class first;
    ``window`` is at most 3600 (see :meth:`uniqjob.stores.base.Backend.drops`).
    ``job_class`` keeps one class (full name, or its last dotted part). Coalesced
    and replaced calls are not in it: :func:`drops` has them.
    """
    return drops(store, window=window, job_class=job_class)["duplicates"]


def drops(
    store: Backend | None = None, *, window: float = WINDOW, job_class: str | None = None
) -> dict[str, dict[str, int]]:
    """Return the refused calls per kind and job class over the last ``window`` seconds.

    ``{"duplicates": {class: n}, "coalesced": {...}, "replaced": {...}}`` (see
    :meth:`uniqjob.stores.base.Backend.drops`), each busiest class first;
    ``job_class`` keeps one class (full name, or its last dotted part).
    """
    backend = store if store is not None else config.default_backend()
    out = {}
    for kind, found in backend.drops(window).items():
        counts = [(cls, n) for cls, n in found.items() if job_class is None or class_matches(cls, job_class)]
        out[kind] = dict(sorted(counts, key=lambda item: (-item[1], item[0])))
    return out


@dataclass(frozen=True, slots=True)
class Stats:
    """A store's figures over every key: its locks, its concurrency totals and its refused calls by kind.

    ``pending``: queue locks with a pending call ("keep_last" behind a running call);
    ``debouncing``: debounced jobs not yet due (``unique_debounce``).
    """

    queued: int
    running: int
    orphaned: int
    corrupt: int
    concurrency: Totals
    duplicates: dict[str, int]
    window: float
    coalesced: dict[str, int] = field(default_factory=dict)
    replaced: dict[str, int] = field(default_factory=dict)
    pending: int = 0
    debouncing: int = 0

    def to_json(self) -> dict[str, object]:
        """Return the figures as the JSON object ``uniqjob stats --json`` prints."""
        return {
            "locks": {
                "queued": self.queued,
                "running": self.running,
                "orphaned": self.orphaned,
                "corrupt": self.corrupt,
                "pending": self.pending,
                "debouncing": self.debouncing,
            },
            "concurrency": self.concurrency.to_json(),
            "duplicates": self.duplicates,
            "coalesced": self.coalesced,
            "replaced": self.replaced,
            "window_s": self.window,
        }


def stats(store: Backend | None = None, *, window: float = WINDOW) -> Stats:
    """Read ``store``'s figures (None: the configured store): every lock and concurrency key, streaming."""
    backend = store if store is not None else config.default_backend()
    kinds = drops(backend, window=window)  # first: a bad window fails before the scans
    locks = LockCounts()
    for row in iter_rows(backend):
        locks.add(row)
    totals = concurrency(backend, top=0).totals
    return Stats(
        locks.queued, locks.running, locks.orphaned, locks.corrupt, totals, kinds["duplicates"],
        float(window), kinds["coalesced"], kinds["replaced"], locks.pending, locks.debouncing,
    )  # fmt: skip
