"""The memory store: locks (:class:`MemoryBackend`) and semaphores (:class:`MemorySemaphores`) in this
process's memory, for users' unit tests."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import cast

from . import _drops
from ._schema import Record
from ._template import Held, LockMachineBackend, MachineStore, RecordStore
from ._urls import Invalid, bad, options, split
from .semaphores import SemaphoreStore

__all__ = ["MEMORY_URL_OPTIONS", "MemoryBackend", "MemorySemaphores", "from_url"]

#: A ``memory://`` URL carries none.
MEMORY_URL_OPTIONS: dict[str, str] = {}


class _MemoryRecords(RecordStore):
    """One record per key in a dict under one mutex, on an injectable clock (seconds).

    Fences come from one counter for the whole store, never forgotten: a fence
    is then greater than every earlier one of any key, so of its own key too.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._records: dict[str, Record] = {}
        self._mutex = threading.Lock()
        self._last_fence = 0
        self._drops: _drops.Counts = {}  # the locks' dropped duplicates (Backend.drops)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<{len(self._records)} keys>)"

    def _fresh(self, record: Record) -> Record:
        """What a transition is handed of a stored record: a lock's are replaced, never changed in place."""
        return record

    def _fence(self, now_us: int) -> int:
        """Issue a fence: the clock in microseconds, or one past the last fence if that is not more."""
        fence = self._last_fence = max(now_us, self._last_fence + 1)  # the mutex is held
        return fence

    def _held(self, key: str) -> _Holding:
        return _Holding(self, key)

    def _count(self, cls: str, now: float, n: int, kind: str) -> None:
        _drops.add(self._drops, cls, now, n, kind)  # the mutex is held

    def _put(self, key: str, record: Record | None) -> None:
        if record is None:
            self._records.pop(key, None)
        else:
            self._records[key] = record

    def purge(self, key: str) -> list[str]:
        """Remove ``key``'s record whatever it holds; return ``[key]`` if there was one, else ``[]``."""
        with self._mutex:
            return [key] if self._records.pop(key, None) is not None else []


class _Holding:
    """``_MemoryRecords._held(key)``: the store's mutex held, ``key``'s record read, for the ``with`` body.

    (A class rather than ``@contextmanager``: every transition enters one.)
    """

    __slots__ = ("key", "store")

    def __init__(self, store: _MemoryRecords, key: str) -> None:
        self.store, self.key = store, key

    def __enter__(self) -> Held:
        store, key = self.store, self.key
        store._mutex.acquire()
        try:
            stored = store._records.get(key)
            return Held(
                None if stored is None else store._fresh(stored),
                store.clock(),
                functools.partial(store._put, key),
                store._fence,
                store._count,
            )
        except BaseException:
            store._mutex.release()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.store._mutex.release()


class MemoryBackend(_MemoryRecords, LockMachineBackend):
    """Locks held in a dict, for one process: fast, isolated, gone at exit.

    ``clock`` (seconds) is injectable so tests can age leases without sleeping.
    """

    name = "memory"

    def scan(self) -> Iterator[str]:
        with self._mutex:
            keys = list(self._records)
        yield from keys

    def drops(self, window: float = _drops.WINDOW) -> _drops.Tally:
        with self._mutex:
            return _drops.tally(self._drops, _drops.first_minute(self.clock(), window))

    def semaphores(self) -> SemaphoreStore:
        """A new semaphore store in this process, on this backend's clock (followed if swapped later)."""
        return MemorySemaphores(clock=lambda: self.clock())  # noqa: PLW0108 - a clock swapped in later is followed


class MemorySemaphores(_MemoryRecords, MachineStore):
    """Semaphores in a dict, for one process; ``clock`` is injectable so tests never sleep."""

    name = "memory"

    def _fresh(self, record: Record) -> Record:
        """A deep copy: the stored record stays whole if a transition (in place) raises half-way."""
        return cast(Record, json.loads(json.dumps(record)))

    def scan(self) -> Iterator[str]:
        with self._mutex:
            keys = [k for k, r in self._records.items() if r["slots"] or r["parked"]]
        yield from keys


def from_url(url: str) -> MemoryBackend:
    """A new MemoryBackend for ``memory://``, which takes no host, path or option."""
    try:
        parts = split(url)
        options(parts, MEMORY_URL_OPTIONS)
        if parts.netloc or parts.path:
            raise Invalid("memory:// takes no host or path")
    except Invalid as exc:
        raise bad("memory", url, exc) from None
    return MemoryBackend()
