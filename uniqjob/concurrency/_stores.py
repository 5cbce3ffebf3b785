"""The semaphore store that goes with each lock backend: same place, separate key space.

And its typed async face, for the asyncio API (:func:`async_semaphores`, an
:class:`~uniqjob.stores.semaphores_aio.AsyncSemaphores`): the memory store is
called in the event loop itself (it never waits), Redis awaited through
``redis.asyncio`` on the lock store's async connections
(:mod:`uniqjob.stores.redis._async_semaphores`), any other store (files, a
plugin) called in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import threading
import weakref
from typing import TypeVar

from ..errors import ConfigurationError
from ..stores.aio import async_backend
from ..stores.base import Backend
from ..stores.semaphores import SemaphoreStore
from ..stores.semaphores_aio import AsyncSemaphores, DirectSemaphores

__all__ = ["AsyncSemaphores", "SemaphoreStore", "async_semaphores", "store_for"]

T = TypeVar("T")

_stores: weakref.WeakKeyDictionary[Backend, SemaphoreStore] = weakref.WeakKeyDictionary()
_backends: weakref.WeakKeyDictionary[SemaphoreStore, weakref.ref[Backend]] = weakref.WeakKeyDictionary()
_mutex = threading.Lock()

_faces: weakref.WeakKeyDictionary[SemaphoreStore, AsyncSemaphores] = weakref.WeakKeyDictionary()


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
            _backends[store] = weakref.ref(backend)
        return store


def _make(backend: Backend) -> SemaphoreStore:
    made = backend.semaphores()
    if not isinstance(made, SemaphoreStore):
        found = type(made).__name__
        raise ConfigurationError(f"{backend!r}.semaphores() returned {found}, not a SemaphoreStore")
    return made


def async_semaphores(store: SemaphoreStore) -> AsyncSemaphores:
    """Return the async face of ``store`` (one per store object, made on first use)."""
    face = _faces.get(store)
    if face is None:
        face = _faces[store] = _face_of(store)
    return face


def _face_of(store: SemaphoreStore) -> AsyncSemaphores:
    from ..stores.memory import MemorySemaphores

    if isinstance(store, MemorySemaphores):
        return DirectSemaphores(store)
    try:
        from ..stores.redis._async import RedisAsync
        from ..stores.redis._async_semaphores import RedisAsyncSemaphores
        from ..stores.redis._semaphores import RedisSemaphores
    except ImportError:  # pragma: no cover - redis is a dependency
        return AsyncSemaphores(store)
    ref = _backends.get(store)
    backend = ref() if ref is not None else None
    if isinstance(store, RedisSemaphores) and backend is not None:
        face = async_backend(backend)
        if isinstance(face, RedisAsync):
            return RedisAsyncSemaphores(store, face)
    return AsyncSemaphores(store)

