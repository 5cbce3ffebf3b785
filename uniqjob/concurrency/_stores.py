"""The semaphore store that goes with each lock backend (same place, separate key space), and its async face.

The async face (an :class:`~uniqjob.stores.semaphores_aio.AsyncSemaphores`) is
what the asyncio API awaits: the memory store is called in the event loop
itself (it never waits), Redis awaited through ``redis.asyncio`` on the lock
store's async connections, any other store (files, a plugin) called in a thread.
"""

from __future__ import annotations

import threading
import weakref

from ..errors import ConfigurationError
from ..stores.aio import async_backend
from ..stores.base import Backend
from ..stores.semaphores import SemaphoreStore
from ..stores.semaphores_aio import AsyncSemaphores, DirectSemaphores

__all__ = ["AsyncSemaphores", "SemaphoreStore", "async_semaphores", "store_for"]

_stores: weakref.WeakKeyDictionary[Backend, SemaphoreStore] = weakref.WeakKeyDictionary()
_backends: weakref.WeakKeyDictionary[SemaphoreStore, weakref.ref[Backend]] = weakref.WeakKeyDictionary()
_faces: weakref.WeakKeyDictionary[SemaphoreStore, AsyncSemaphores] = weakref.WeakKeyDictionary()
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
            store = backend.semaphores()
            if not isinstance(store, SemaphoreStore):
                found = type(store).__name__
                raise ConfigurationError(f"{backend!r}.semaphores() returned {found}, not a SemaphoreStore")
            _stores[backend] = store
            _backends[store] = weakref.ref(backend)
        return store


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
    from ..stores.redis._async import RedisAsync
    from ..stores.redis._async_semaphores import RedisAsyncSemaphores
    from ..stores.redis._semaphores import RedisSemaphores

    ref = _backends.get(store)
    backend = ref() if ref is not None else None
    if isinstance(store, RedisSemaphores) and backend is not None:
        face = async_backend(backend)
        if isinstance(face, RedisAsync):
            return RedisAsyncSemaphores(store, face)
    return AsyncSemaphores(store)
