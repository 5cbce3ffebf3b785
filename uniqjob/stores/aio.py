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

import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .base import Backend

__all__ = [
    "AsyncBackend",
    "DirectAsync",
    "ThreadAsync",
    "async_backend",
    "completed",
    "in_thread",
    "made",
    "register",
]

T = TypeVar("T")


class AsyncBackend:
    """Awaits the primitives of ``sync`` (see :class:`~uniqjob.stores.base.Backend` for each)."""

    def __init__(self, sync: Backend) -> None:
        #: The sync backend this one acts on: the same store and records.
        self.sync = sync

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Await primitive ``name`` of the contract with these arguments; its answer."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close what this object holds of its own (the sync backend is closed on its own)."""


class DirectAsync(AsyncBackend):
    """A store whose primitives never wait (memory): called in the event loop itself."""

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return getattr(self.sync, name)(*args, **kwargs)


class ThreadAsync(AsyncBackend):
    """A store whose primitives may wait (files, any other): each called in a worker thread."""

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return await in_thread(getattr(self.sync, name), *args, **kwargs)


async def in_thread(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``await asyncio.to_thread(function, ...)``, made even if the task is cancelled meanwhile.

    A cancelled ``to_thread`` drops a call still waiting for a worker thread, and one
    already running goes on: a release dropped would leave its lock or slot for a lease,
    an acquire going on could land after the undo that follows. So the call is always
    made, and the cancellation is raised once it has ended (what it took is then undone).
    """
    import asyncio  # in the functions: the sync API never loads it (tests/test_imports.py)

    return await completed(asyncio.to_thread(function, *args, **kwargs))


async def completed(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end even if the task is cancelled meanwhile; then raise the cancellation.

    However often it is cancelled: anyio's cancel scopes (Starlette, FastAPI) cancel
    every await inside them again until the scope exits, so a single shield would not do.
    """
    import asyncio

    task = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the cancellation is the news, not a failure of the call
        raise cancelled
    return task.result()


def made(backend: Backend, name: str) -> Callable[..., Awaitable[Any]]:
    """Primitive ``name`` of ``backend`` awaited (on its async face) through :func:`completed`."""

    async def call(*args: Any, **kwargs: Any) -> Any:
        return await completed(async_backend(backend).call(name, args, kwargs))

    return call


# A store class's async face (a subclass first: the most derived registered class wins).
_FACES: list[tuple[type[Backend], type[AsyncBackend]]] = []
_MADE: weakref.WeakKeyDictionary[Backend, AsyncBackend] = weakref.WeakKeyDictionary()
_loaded: list[bool] = []  # the built-in faces are registered (on first use: no import cycle)


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


def _load() -> None:
    """Register the faces of the stores that have one of their own (once)."""
    if _loaded:
        return
    _loaded.append(True)
    from .memory import MemoryBackend

    _FACES.append((MemoryBackend, DirectAsync))
    try:
        from .redis._async import RedisAsync
        from .redis._store import RedisBackend
    except ImportError:  # pragma: no cover - redis is a dependency; a plugin store is awaited in threads
        return
    _FACES.append((RedisBackend, RedisAsync))
