"""The semaphore store that goes with each lock backend: same place, separate key space."""

from __future__ import annotations

import threading
import weakref

from ..errors import ConfigurationError
from ..stores.base import Backend
from ..stores.semaphores import SemaphoreStore

__all__ = ["store_for"]

_stores: weakref.WeakKeyDictionary[Backend, SemaphoreStore] = weakref.WeakKeyDictionary()
_mutex = threading.Lock()


def store_for(backend: Backend) -> SemaphoreStore:
    """Return the semaphore store kept beside ``backend``'s locks (one per backend object).

    Redis: the same server and namespace, under ``<namespace>:c:``. Files: the
    ``concurrency/`` directory inside the lock directory. Memory: this process.
    Each backend makes its own (:meth:`~uniqjob.stores.base.Backend.semaphores`).
    """
    with _mutex:
        store = _stores.get(backend)
        if store is None:
            store = _stores[backend] = _make(backend)
        return store


def _make(backend: Backend) -> SemaphoreStore:
    made = backend.semaphores()
    if not isinstance(made, SemaphoreStore):
        found = type(made).__name__
        raise ConfigurationError(f"{backend!r}.semaphores() returned {found}, not a SemaphoreStore")
    return made
