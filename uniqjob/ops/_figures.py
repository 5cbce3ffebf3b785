"""Figures about concurrency keys, for metrics and for ``uniqjob locks --concurrency``.

A key at its limit looks like a stalled pipeline from outside; these say which
keys are full, whether their holders are alive, how many jobs wait behind them
and for how long. :func:`concurrency` reads every key once (streaming the
store's scan) and returns the busiest keys plus true totals over all of them,
however short the list is cut::

    report = uniqjob.ops.concurrency(top=20)
    gauge("uniqjob.parked", report.totals.parked)
    gauge("uniqjob.oldest_wait_s", report.totals.oldest_wait or 0)
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from .. import config
from ..concurrency import SemaphoreState, store_for
from ..concurrency.ops import stale
from ..stores.base import Backend
from ._locks import class_matches, json_fields
from ._pages import read_slots

__all__ = ["ConcurrencyReport", "KeyReport", "Totals", "concurrency", "concurrency_key", "iter_keys"]


@dataclass(frozen=True, slots=True)
class KeyReport:
    """One concurrency key: slots held of its limit, their lease state, and the jobs parked behind it.

    A slot is **stale** when its lease has lapsed (it is freed at the key's
    next settle) or its holder is provably dead (this host only); else fresh.
    """

    key: str
    job_class: str
    limit: int
    held: int
    running: int
    fresh: int
    stale: int
    parked: int
    oldest_wait: float | None  # seconds the oldest parked job has waited

    @property
    def at_limit(self) -> bool:
        return self.held >= self.limit

    @property
    def lease(self) -> Literal["fresh", "stale", "mixed", "-"]:
        """The lease state of the key's slots as one word."""
        if not self.held:
            return "-"
        if not self.stale:
            return "fresh"
        return "stale" if not self.fresh else "mixed"

    @classmethod
    def from_state(cls, state: SemaphoreState) -> KeyReport:
        """Summarise a snapshot of one key."""
        lapsed = sum(1 for s in state.slots if stale(s))
        wait = state.oldest_wait
        return cls(
            key=state.key,
            job_class=state.job_class,
            limit=state.limit,
            held=len(state.slots),
            running=sum(1 for s in state.slots if s.status == "running"),
            fresh=len(state.slots) - lapsed,
            stale=lapsed,
            parked=state.parked,
            oldest_wait=None if wait is None else round(wait, 3),
        )

    def to_json(self) -> dict[str, object]:
        """Return the figures as a JSON-ready dict."""
        return {
            "key": self.key,
            "class": self.job_class or None,
            "limit": self.limit,
            "held": self.held,
            "running": self.running,
            "fresh": self.fresh,
            "stale": self.stale,
            "lease": self.lease,
            "at_limit": self.at_limit,
            "parked": self.parked,
            "oldest_wait_s": self.oldest_wait,
        }


@dataclass(frozen=True, slots=True)
class Totals:
    """Figures over every key, listed or not."""

    keys: int = 0
    slots_held: int = 0
    stale_slots: int = 0
    keys_at_limit: int = 0
    parked: int = 0
    oldest_wait: float | None = field(default=None, metadata={"json": "oldest_wait_s"})

    def to_json(self) -> dict[str, object]:
        """Return the totals as a JSON-ready dict."""
        return json_fields(self)


@dataclass(frozen=True, slots=True)
class ConcurrencyReport:
    """The busiest keys (``keys``, busiest first), the totals over all, and how many keys were left out."""

    keys: list[KeyReport]
    totals: Totals
    left_out: int


def _busiest(row: KeyReport) -> tuple[int, float, int, int, str]:
    """Sort order: most parked, longest wait, most stale, fullest; then by key."""
    return (-row.parked, -(row.oldest_wait or 0.0), -row.stale, -row.held, row.key)


def iter_keys(backend: Backend | None = None, *, job_class: str | None = None) -> Iterator[KeyReport]:
    """Yield a report per concurrency key, as the store's scan finds them; emptied keys are skipped."""
    store = store_for(backend if backend is not None else config.default_backend())
    for state in read_slots(store, head=1):
        if not state.empty and (job_class is None or class_matches(state.job_class, job_class)):
            yield KeyReport.from_state(state)


def concurrency(
    backend: Backend | None = None, *, top: int | None = None, job_class: str | None = None
) -> ConcurrencyReport:
    """Return the ``top`` busiest concurrency keys (all if None) and totals over every key.

    Memory stays bounded by ``top`` however many keys the store holds.
    ``job_class`` keeps one class's keys (full name, or its last dotted part).
    """
    keys = slots = lapsed = full = parked = 0
    oldest: float | None = None
    kept: list[KeyReport] = []
    for row in iter_keys(backend, job_class=job_class):
        keys += 1
        slots += row.held
        lapsed += row.stale
        full += row.at_limit
        parked += row.parked
        if row.oldest_wait is not None and (oldest is None or row.oldest_wait > oldest):
            oldest = row.oldest_wait
        kept.append(row)
        if top is not None and len(kept) > 2 * top + 64:
            kept = heapq.nsmallest(top, kept, key=_busiest)
    listed = sorted(kept, key=_busiest)[: top if top is not None else None]
    totals = Totals(keys, slots, lapsed, full, parked, oldest)
    return ConcurrencyReport(listed, totals, keys - len(listed))


def concurrency_key(key: str, backend: Backend | None = None) -> KeyReport | None:
    """Return the report of one concurrency key; None if it holds nothing."""
    store = store_for(backend if backend is not None else config.default_backend())
    state = store.read(key, head=1)
    return None if state.empty else KeyReport.from_state(state)
