"""The semaphore store that goes with each lock backend: same place, separate key space."""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import ConfigurationError
from ..stores.base import Backend
from .base import SemaphoreStore

if TYPE_CHECKING:
    from ..stores.file import FileBackend
    from ..stores.memory import MemoryBackend

__all__ = ["store_for"]

_stores: weakref.WeakKeyDictionary[Backend, SemaphoreStore] = weakref.WeakKeyDictionary()
_mutex = threading.Lock()


def store_for(backend: Backend) -> SemaphoreStore:
    """Return the semaphore store kept beside ``backend``'s locks (one per backend object).

    Redis: the same server and namespace, under ``<namespace>:c:``. Files: the
    ``concurrency/`` directory inside the lock directory. Memory: this process.
    Another backend may provide one with a ``semaphores()`` method.
    """
    with _mutex:
        store = _stores.get(backend)
        if store is None:
            store = _stores[backend] = _make(backend)
        return store


def _make(backend: Backend) -> SemaphoreStore:
    custom = getattr(backend, "semaphores", None)
    if callable(custom):
        made = custom()
        if not isinstance(made, SemaphoreStore):
            found = type(made).__name__
            raise ConfigurationError(f"{backend!r}.semaphores() returned {found}, not a SemaphoreStore")
        return made
    from ..stores.file import FileBackend
    from ..stores.memory import MemoryBackend

    if isinstance(backend, MemoryBackend):
        from .local import MemorySemaphores

        return MemorySemaphores(clock=_clock_of(backend))
    if isinstance(backend, FileBackend):
        from .local import FileSemaphores

        directory = backend.directory / "concurrency"
        return FileSemaphores(directory, timeout=backend.timeout, clock=_clock_of(backend))
    # Only a process that imported the Redis backend can hold one; never import redis otherwise.
    redis_module = sys.modules.get("uniqjob.stores.redis._store")
    if redis_module is not None and isinstance(backend, redis_module.RedisBackend):
        from .redis import RedisSemaphores

        return RedisSemaphores(backend.client, namespace=backend.namespace)
    raise ConfigurationError(
        f"{type(backend).__name__} keeps no concurrency slots: use Redis, file or memory, "
        "or give the backend a semaphores() method returning a uniqjob.concurrency.SemaphoreStore"
    )


def _clock_of(backend: FileBackend | MemoryBackend) -> Callable[[], float]:
    """The backend's clock, read through the backend, so a clock swapped in later is followed."""
    return lambda: backend.clock()  # noqa: PLW0108 - not bound now: a clock swapped in later is followed
