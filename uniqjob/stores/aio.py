"""The lock contract's primitives as coroutines, for the asyncio API.

An :class:`AsyncBackend` stands beside a sync :class:`~uniqjob.stores.base.Backend`
(its ``sync``) and awaits the same primitives on the same store:

- the memory store is called directly (it never waits on anything);
- Redis goes through ``redis.asyncio`` (:mod:`uniqjob.stores.redis._async`):
  the same scripts and the same reply decoding as the sync store, one round
  trip per primitive;
- any other store (files, a plugin) is called in a thread
  (``asyncio.to_thread``), so its waits (a file lock, a disk) never block the
  event loop.

Heartbeats of async holders still renew through the sync backend, on the
heartbeat's own threads: a busy event loop cannot starve them.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from ._async_base import AsyncBackend, completed, in_thread
from .base import Backend

__all__ = [
    "AsyncBackend",
    "DirectAsync",
    "ThreadAsync",
    "async_backend",
    "completed",
    "in_thread",
    "register",
]


class DirectAsync(AsyncBackend):
    """A store whose primitives never wait (memory): called in the event loop itself.

    Each primitive takes and returns what :class:`AsyncBackend`'s does (the sync one's), and
    calls it directly: a traceback reads the face's primitive, then the store's.
    """

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        return self.sync.claim(*args, **kwargs)

    async def start(self, *args: Any, **kwargs: Any) -> Any:
        return self.sync.start(*args, **kwargs)

    async def attach(self, *args: Any, **kwargs: Any) -> Any:
        return self.sync.attach(*args, **kwargs)

    async def requeue(self, *args: Any, **kwargs: Any) -> Any:
        return self.sync.requeue(*args, **kwargs)

    async def renew(self, *args: Any, **kwargs: Any) -> Any:
        return self.sync.renew(*args, **kwargs)

    async def finish(self, *args: Any, **kwargs: Any) -> Any:
        return self.sync.finish(*args, **kwargs)

    async def dequeue(self, *args: Any, **kwargs: Any) -> Any:
        return self.sync.dequeue(*args, **kwargs)

    async def reclaim(self, *args: Any, **kwargs: Any) -> Any:
        return self.sync.reclaim(*args, **kwargs)

    async def read(self, *args: Any, **kwargs: Any) -> Any:
        return self.sync.read(*args, **kwargs)

    async def read_many(self, *args: Any, **kwargs: Any) -> Any:
        return self.sync.read_many(*args, **kwargs)


class ThreadAsync(AsyncBackend):
    """A store whose primitives may wait (files, any other): each called in a worker thread
    (:class:`AsyncBackend`'s own primitives, named here for the registry)."""


# A store class's async face (a subclass first: the most derived registered class wins).
_FACES: list[tuple[type[Backend], type[AsyncBackend]]] = []
_MADE: weakref.WeakKeyDictionary[Backend, AsyncBackend] = weakref.WeakKeyDictionary()


def register(store: type[Backend], face: type[AsyncBackend]) -> None:
    """Say that backends of class ``store`` (and subclasses) are awaited through ``face``."""
    _FACES.insert(0, (store, face))


def async_backend(backend: Backend) -> AsyncBackend:
    """Return the async face of ``backend``: one per backend object, made on first use."""
    made = _MADE.get(backend)
    if made is None:
        _load()
        face = next((face for store, face in _FACES if isinstance(backend, store)), ThreadAsync)
        made = _MADE[backend] = face(backend)
    return made


@functools.cache
def _load() -> None:
    """Register the faces of the stores that have one of their own (once, on first use: no import cycle)."""
    from .memory import MemoryBackend

    _FACES.append((MemoryBackend, DirectAsync))
    try:
        from .redis._async import RedisAsync
        from .redis._store import RedisBackend
    except ImportError:  # pragma: no cover - redis is a dependency; a plugin store is awaited in threads
        return
    _FACES.append((RedisBackend, RedisAsync))
