"""The memory store: locks (:class:`MemoryBackend`) and semaphores (:class:`MemorySemaphores`) in this
process's memory, for users' unit tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ._machine import Machine, MachineStore
from ._machine import Record as SemaphoreRecord
from ._records import Record, Slot, SlotBackend
from ._urls import Invalid, bad, options, split
from .semaphores import SemaphoreStore

__all__ = ["MEMORY_URL_OPTIONS", "MemoryBackend", "MemorySemaphores", "from_url"]

#: A ``memory://`` URL carries none.
MEMORY_URL_OPTIONS: dict[str, str] = {}


class MemoryBackend(SlotBackend):
    """Locks held in a dict, for one process: fast, isolated, gone at exit.

    ``clock`` (seconds) is injectable so tests can age leases without sleeping.
    Fences come from one counter for the whole store, never forgotten: a fence
    is then greater than every earlier one of any key, so of its own key too.
    """

    name = "memory"

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._records: dict[str, Record] = {}
        self._mutex = threading.Lock()
        self._last_fence = 0

    def _fence(self, now_us: int) -> int:
        """Issue a fence: the clock in microseconds, or one past the last fence if that is not more."""
        fence = self._last_fence = max(now_us, self._last_fence + 1)  # the mutex is held
        return fence

    @contextmanager
    def _slot(self, key: str) -> Iterator[Slot]:
        with self._mutex:
            slot = Slot(key, self._records.get(key), self.clock(), self._fence)
            yield slot
            if slot.changed:
                record = slot.record()
                if record is None:
                    self._records.pop(key, None)
                else:
                    self._records[key] = record

    def scan(self) -> Iterator[str]:
        with self._mutex:
            keys = list(self._records)
        yield from keys

    def purge(self, key: str) -> list[str]:
        """Remove ``key``'s record whatever it holds; return ``[key]`` if there was one, else ``[]``."""
        with self._mutex:
            return [key] if self._records.pop(key, None) is not None else []

    def semaphores(self) -> SemaphoreStore:
        """A new semaphore store in this process, on this backend's clock (followed if swapped later)."""
        return MemorySemaphores(clock=lambda: self.clock())  # noqa: PLW0108 - a clock swapped in later is followed

    def __repr__(self) -> str:
        return f"MemoryBackend(<{len(self._records)} keys>)"


class MemorySemaphores(MachineStore):
    """Semaphores in a dict, for one process; ``clock`` is injectable so tests never sleep."""

    name = "memory"

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._records: dict[str, SemaphoreRecord] = {}
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"MemorySemaphores(<{len(self._records)} keys>)"

    @contextmanager
    def _machine(self, key: str, *, write: bool = True) -> Iterator[Machine]:
        with self._mutex:
            # A deep copy, so a transition that raises half-way leaves the stored record untouched.
            stored = self._records.get(key)
            m = Machine(key, json.loads(json.dumps(stored)) if stored else None, self.clock())
            yield m
            if write and m.changed:
                record = m.record()
                if record is None:
                    self._records.pop(key, None)
                else:
                    self._records[key] = record

    def scan(self) -> Iterator[str]:
        with self._mutex:
            keys = [k for k, r in self._records.items() if r["slots"] or r["parked"]]
        yield from keys

    def purge(self, key: str) -> list[str]:
        """Remove ``key``'s record whatever it holds; return ``[key]`` if there was one, else ``[]``."""
        with self._mutex:
            return [key] if self._records.pop(key, None) is not None else []


def from_url(url: str) -> MemoryBackend:
    """A new MemoryBackend for ``memory://``, which takes no host, path or option."""
    try:
        parts = split(url)
        options(parts, MEMORY_URL_OPTIONS)
    except Invalid as exc:
        raise bad("memory", url, exc) from None
    if parts.netloc or parts.path:
        raise bad("memory", url, "memory:// takes no host or path")
    return MemoryBackend()
