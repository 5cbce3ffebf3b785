"""A store written inside the tests, as a user would write one: the proof that a new store is one module.

Locks are a :class:`~uniqjob.stores.LockMachineBackend` and semaphores a
:class:`~uniqjob.stores.MachineStore`, each over a plain dict under
one mutex. Each writes its hook (``_lock_machine``, ``_machine``) and what the hooks
cannot give: ``scan`` (the contracts' one streaming read), ``purge`` (an
operator's forced release; optional, the contract suite holds it) and a
fence counter and a counter of dropped duplicates handed to each :class:`LockMachine`, and
``drops`` to read the latter. Everything else, every
transition, comes from the two bases. ``tests/conftest.py`` registers it
under ``dict://`` and puts it in the one list of stores, so both contract
suites run against it.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from uniqjob.stores import LockMachine, LockMachineBackend, Machine, MachineStore, _drops
from uniqjob.stores.semaphores import SemaphoreStore

__all__ = ["DictBackend", "DictSemaphores", "from_url"]


class DictBackend(LockMachineBackend):
    """Locks in a dict, one record per key, on an injectable clock."""

    name = "dict"

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.records: dict[str, dict[str, Any]] = {}
        self.mutex = threading.Lock()
        self.last_fence = 0  # fences outlive their records: a purge or a release never resets them
        self.counts: _drops.Counts = {}  # dropped duplicates, counted by the LockMachine under the mutex

    def _fence(self, now_us: int) -> int:
        self.last_fence = max(now_us, self.last_fence + 1)
        return self.last_fence

    @contextmanager
    def _lock_machine(self, key: str) -> Iterator[LockMachine]:
        with self.mutex:
            locks = LockMachine(
                key, copy.deepcopy(self.records.get(key)), self.clock(), self._fence, self._count
            )
            yield locks
            if locks.changed:
                record = locks.record()
                if record is None:
                    self.records.pop(key, None)
                else:
                    self.records[key] = record

    def _count(self, cls: str, now: float, n: int, kind: str) -> None:
        _drops.add(self.counts, cls, now, n, kind)

    def scan(self) -> Iterator[str]:
        with self.mutex:
            keys = list(self.records)
        yield from keys

    def drops(self, window: float = _drops.WINDOW) -> _drops.Tally:
        with self.mutex:
            return _drops.tally(self.counts, _drops.first_minute(self.clock(), window))

    def purge(self, key: str) -> list[str]:
        with self.mutex:
            return [key] if self.records.pop(key, None) is not None else []

    def semaphores(self) -> SemaphoreStore:
        return DictSemaphores(clock=lambda: self.clock())  # noqa: PLW0108 - follows a clock swapped in later


class DictSemaphores(MachineStore):
    """Semaphores in a dict, one record per key, on an injectable clock."""

    name = "dict"

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.records: dict[str, dict[str, Any]] = {}
        self.mutex = threading.Lock()

    @contextmanager
    def _machine(self, key: str, *, write: bool = True) -> Iterator[Machine]:
        with self.mutex:
            # A copy, so a transition that raises half-way leaves the stored record as it was.
            machine = Machine(key, copy.deepcopy(self.records.get(key)), self.clock())
            yield machine
            if write and machine.changed:
                record = machine.record()
                if record is None:
                    self.records.pop(key, None)
                else:
                    self.records[key] = record

    def scan(self) -> Iterator[str]:
        with self.mutex:
            keys = [key for key, record in self.records.items() if record["slots"] or record["parked"]]
        yield from keys


def from_url(url: str) -> DictBackend:
    """A new DictBackend for any ``dict://`` URL (the rest of the URL only tells stores apart)."""
    return DictBackend()
