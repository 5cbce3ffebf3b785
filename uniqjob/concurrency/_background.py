"""A background event loop for the sync path's awaitables: an async queue's push (arq's).

A promotion found on the sync path (the courier thread, a sync sweep) may be
for a job class whose queue pushes with a coroutine. It is awaited here, on
one daemon thread's loop, kept for the process (so the queue's connection
pool, made per loop, is kept too); the caller waits for its result.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["Background", "background"]

T = TypeVar("T")


class Background:
    """Runs awaitables to their end on an event loop of its own thread (started on first use)."""

    def __init__(self) -> None:
        self._after_fork()
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._mutex = threading.Lock()  # the parent's loop thread does not survive fork
        self._loop: asyncio.AbstractEventLoop | None = None

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._mutex:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="uniqjob-background", daemon=True).start()
            return loop

    def run(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` on the background loop; its result (or its exception, raised here)."""

        async def awaited() -> Any:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(awaited(), self._running()).result()  # type: ignore[no-any-return]


#: The process's background loop.
background = Background()
