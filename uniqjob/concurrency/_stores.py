"""The semaphore store that goes with each lock backend: same place, separate key space.

And its async face, for the asyncio API (:func:`acall`): the memory store is
called in the event loop itself (it never waits), Redis awaited through
``redis.asyncio`` on the lock store's async connections
(:mod:`uniqjob.stores.redis._async_semaphores`), any other store (files, a
plugin) called in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import ConfigurationError
from ..stores.aio import async_backend, in_thread
from ..stores.base import Backend
from ..stores.semaphores import SemaphoreStore

__all__ = ["acall", "store_for"]

_stores: weakref.WeakKeyDictionary[Backend, SemaphoreStore] = weakref.WeakKeyDictionary()
_backends: weakref.WeakKeyDictionary[SemaphoreStore, weakref.ref[Backend]] = weakref.WeakKeyDictionary()
_mutex = threading.Lock()

#: How a semaphore store's primitive is awaited: ``face(name, args, kwargs)``.
Face = Callable[[str, tuple[Any, ...], dict[str, Any]], Awaitable[Any]]
_faces: weakref.WeakKeyDictionary[SemaphoreStore, Face] = weakref.WeakKeyDictionary()


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


async def acall(store: SemaphoreStore, name: str, *args: Any, **kwargs: Any) -> Any:
    """Await primitive ``name`` of ``store`` with these arguments (the asyncio API's semaphore step)."""
    face = _faces.get(store)
    if face is None:
        face = _faces[store] = _face_of(store)
    return await face(name, args, kwargs)


def _face_of(store: SemaphoreStore) -> Face:
    from ..stores.memory import MemorySemaphores

    if isinstance(store, MemorySemaphores):
        return _direct(store)
    try:
        from ..stores.redis._async_semaphores import RedisAsyncSemaphores
        from ..stores.redis._semaphores import RedisSemaphores
    except ImportError:  # pragma: no cover - redis is a dependency
        return _threaded(store)
    ref = _backends.get(store)
    backend = ref() if ref is not None else None
    if isinstance(store, RedisSemaphores) and backend is not None:
        from ..stores.redis._async import RedisAsync

        face = async_backend(backend)
        if isinstance(face, RedisAsync):
            return RedisAsyncSemaphores(store, face).call
    return _threaded(store)


def _direct(store: SemaphoreStore) -> Face:
    """A face that calls ``store`` in the event loop (a store that never waits)."""

    async def direct(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return getattr(store, name)(*args, **kwargs)

    return direct


def _threaded(store: SemaphoreStore) -> Face:
    """A face that calls ``store`` in a worker thread (a store whose primitives may wait)."""

    async def threaded(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return await in_thread(getattr(store, name), *args, **kwargs)

    return threaded
