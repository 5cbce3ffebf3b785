"""Library-level operations on a store: what ``uniqjob locks``, ``reap``, ``release`` and the rest do.

Each is a plain function that takes a store (``backend``; the configured one
if None) and returns data: rows, counts, what it removed. The command line
only parses arguments and prints what these return. This layer sits on top:
the concurrency operations are the concurrency package's own (the same
objects), offered here beside the rest.

- :func:`iter_rows`: a :class:`LockRow` per held key (a ``corrupt`` row for a record that cannot be read);
- :func:`reap`: reclaim every orphaned lock, by the library's one orphan rule;
- :func:`release`: release what one key names: its locks, a concurrency key's slots, or a corrupt record;
- :func:`sweep`: settle every concurrency key (dead holders' slots freed, promotions pushed);
- :func:`release_slots`, :func:`discard_parked`: an operator's escape hatches for one concurrency key;
- :func:`concurrency`, :func:`concurrency_key`, :func:`iter_keys`: concurrency figures, for metrics;
- :func:`duplicates`: the duplicates dropped per job class over the last hour, as the store counted them;
  :func:`drops`: those, and the calls coalesced and replaced, per kind;
- :func:`stats`: all the figures above over the whole store, in one read (``uniqjob stats``, metrics).
"""

from __future__ import annotations

from ..concurrency import Released, discard_parked, release_slots, sweep
from ..concurrency.ops import stale
from ._drops import Stats, drops, duplicates, stats
from ._figures import ConcurrencyReport, KeyReport, Totals, concurrency, concurrency_key, iter_keys
from ._locks import CORRUPT, PARKED, LockRelease, LockRow, Reaped, iter_rows, reap, release

__all__ = [
    "CORRUPT",
    "PARKED",
    "ConcurrencyReport",
    "KeyReport",
    "LockRelease",
    "LockRow",
    "Reaped",
    "Released",
    "Stats",
    "Totals",
    "concurrency",
    "concurrency_key",
    "discard_parked",
    "drops",
    "duplicates",
    "iter_keys",
    "iter_rows",
    "reap",
    "release",
    "release_slots",
    "stale",
    "stats",
    "sweep",
]
