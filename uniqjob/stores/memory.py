"""MemoryBackend: locks in this process's memory, for users' unit tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ._records import Record, Slot, SlotBackend
from ._urls import Invalid, bad, options, split

__all__ = ["MEMORY_URL_OPTIONS", "MemoryBackend", "from_url"]

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

    def __repr__(self) -> str:
        return f"MemoryBackend(<{len(self._records)} keys>)"


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
