"""Library-level operations on a store: what ``uniqjob locks``, ``reap``, ``release`` and the rest do.

Each is a plain function that takes a store (``backend``; the configured one
if None) and returns data: rows, counts, what it removed. The command line
only parses arguments and prints what these return.

- :func:`iter_rows`: a :class:`LockRow` per held key (a ``corrupt`` row for a record that cannot be read);
- :func:`reap`: reclaim every orphaned lock, by the library's one orphan rule;
- :func:`release`: release what one key names: its locks, a concurrency key's slots, or a corrupt record;
- :func:`sweep`: settle every concurrency key (dead holders' slots freed, promotions pushed);
- :func:`release_slots`, :func:`discard_parked`: an operator's escape hatches for one concurrency key;
- :func:`concurrency`, :func:`concurrency_key`, :func:`iter_keys`: concurrency figures, for metrics.
"""

from __future__ import annotations

from ._figures import ConcurrencyReport, KeyReport, Totals, concurrency, concurrency_key, iter_keys
from ._locks import CORRUPT, LockRelease, LockRow, Reaped, iter_rows, reap, release
from ._slots import Released, discard_parked, release_slots, stale, sweep

__all__ = [
    "CORRUPT",
    "ConcurrencyReport",
    "KeyReport",
    "LockRelease",
    "LockRow",
    "Reaped",
    "Released",
    "Totals",
    "concurrency",
    "concurrency_key",
    "discard_parked",
    "iter_keys",
    "iter_rows",
    "reap",
    "release",
    "release_slots",
    "stale",
    "sweep",
]
