"""Test helpers shared across test modules (a fault-injecting proxy, ...)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from tests.redis_server import RedisServer

__all__ = ["StallFirst", "module_redis_server", "route", "sigstop"]


@pytest.fixture(scope="module", name="server")
def module_redis_server() -> Iterator[RedisServer]:
    """A redis-server of the test module's own, which its tests may stop, stall and restart.

    Import it into a test module (``from tests.support import module_redis_server``)
    and take ``server`` as a fixture.
    """
    with RedisServer() as server:
        yield server


def sigstop(pid: int, timeout: float = 5.0) -> None:
    """Stop process ``pid`` (SIGSTOP) and return once it is stopped, not merely signalled (Linux /proc)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rpartition(")")[2].split()[0] in ("T", "t"):
                    return
        except OSError:
            return  # no /proc (not Linux): the signal has to do
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop within {timeout}s of SIGSTOP")


Face = Callable[[str, tuple[Any, ...], dict[str, Any]], Awaitable[Any]]


class StallFirst:
    """A store's async face (``face(name, args, kwargs)``) whose first call of ``name`` never
    reaches ``real``: it waits until cancelled. ``stalled`` is set once it waits; ``sent`` names
    every call that went on to ``real``, each ``delay`` seconds late (a round trip that a
    cancellation can land in). Make it inside the event loop that awaits it."""

    def __init__(self, real: Face, name: str, delay: float = 0.0) -> None:
        self.real, self.name, self.delay = real, name, delay
        self.stalled = asyncio.Event()
        self.sent: list[str] = []

    async def __call__(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name == self.name and not self.stalled.is_set():
            self.stalled.set()
            await asyncio.sleep(3600)  # cancelled here: nothing of this call was sent
        if self.delay:
            await asyncio.sleep(self.delay)
        self.sent.append(name)
        return await self.real(name, args, kwargs)


def route(monkeypatch: pytest.MonkeyPatch, face: Any, through: Face, *names: str) -> None:
    """Make the typed primitives ``names`` of a store's async face (``face.finish(...)``) go through
    ``through(name, args, kwargs)``, a test's stand-in such as a :class:`StallFirst` of ``face.call``."""
    for name in names:

        async def primitive(*args: Any, _name: str = name, **kwargs: Any) -> Any:
            return await through(_name, args, kwargs)

        monkeypatch.setattr(face, name, primitive)
