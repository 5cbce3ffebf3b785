"""MemoryBackend: locks in this process's memory, for users' unit tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ._records import Record, Slot, SlotBackend

__all__ = ["MemoryBackend"]


class MemoryBackend(SlotBackend):
    """Locks held in a dict, for one process: fast, isolated, gone at exit.

    ``clock`` (seconds) is injectable so tests can age leases without sleeping.
    """

    name = "memory"

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._records: dict[str, Record] = {}
        self._mutex = threading.Lock()

    @contextmanager
    def _slot(self, key: str) -> Iterator[Slot]:
        with self._mutex:
            slot = Slot(key, self._records.get(key), self.clock())
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

    def __repr__(self) -> str:
        return f"MemoryBackend(<{len(self._records)} keys>)"
