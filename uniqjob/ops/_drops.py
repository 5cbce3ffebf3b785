"""Dropped duplicates: how many calls each job class lost to a held key, as the store counted them."""

from __future__ import annotations

from .. import config
from ..stores._drops import WINDOW
from ..stores.base import Backend

__all__ = ["duplicates"]


def duplicates(store: Backend | None = None, *, window: float = WINDOW) -> dict[str, int]:
    """Return the duplicates dropped, rescheduled or raised per job class over the last ``window`` seconds.

    The counts are the store's (every process's calls), busiest class first;
    ``window`` is at most 3600 (see :meth:`uniqjob.stores.base.Backend.duplicates`).
    """
    backend = store if store is not None else config.default_backend()
    counts = backend.duplicates(window)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
