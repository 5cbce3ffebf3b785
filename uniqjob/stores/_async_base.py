"""What every async face of a store is (:class:`AsyncBackend`), and how a call is made to its end.

Apart from :mod:`uniqjob.stores.aio`, which picks each store's face: a store's own
face (the Redis store's) builds on this module without importing the module that
imports it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from .base import Backend

__all__ = ["AsyncBackend", "completed", "in_thread"]

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


async def in_thread(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``await asyncio.to_thread(function, ...)``, made even if the task is cancelled meanwhile.

    A cancelled ``to_thread`` drops a call still waiting for a worker thread, and one
    already running goes on: a release dropped would leave its lock or slot for a lease,
    an acquire going on could land after the undo that follows. So the call is always
    made, and the cancellation is raised once it has ended (what it took is then undone).
    """
    return await completed(asyncio.to_thread(function, *args, **kwargs))


async def completed(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end even if the task is cancelled meanwhile; then raise the cancellation.

    However often it is cancelled: anyio's cancel scopes (Starlette, FastAPI) cancel
    every await inside them again until the scope exits, so a single shield would not do.
    """
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
