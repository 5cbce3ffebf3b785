"""Deprecated: the concurrency figures moved to :mod:`uniqjob.ops`.

``uniqjob.inspect`` stays importable for one release: it re-exports the same
objects from :mod:`uniqjob.ops` and warns once, on first import. (Its name
shadowed the standard library's :mod:`inspect`.)
"""

from __future__ import annotations

from ._moved import moved
from .ops import ConcurrencyReport, KeyReport, Totals, concurrency, concurrency_key, iter_keys

__all__ = ["ConcurrencyReport", "KeyReport", "Totals", "concurrency", "concurrency_key", "iter_keys"]

moved(__name__, "uniqjob.ops")
