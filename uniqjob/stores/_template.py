"""The record-machine template: a store that keeps one record per key, written once for both contracts.

A store built on :class:`RecordStore` writes one hook, :meth:`RecordStore._held`:
hold the key's mutual exclusion and yield a :class:`Held`, the key's record as
read with the store's clock and a way to store its next version. The template
turns it into the lock hook (``LockMachineBackend._lock_machine``,
:class:`~._records.LockMachine` transitions) and the semaphore hook (``MachineStore._machine``,
:class:`~._machine.Machine` transitions), so the memory and file stores each
keep their records in one place for their locks and their semaphores alike.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import NamedTuple

from ._machine import Machine
from ._records import Drops, Fences, LockMachine
from ._schema import Record

__all__ = ["Held", "RecordStore"]


class Held(NamedTuple):
    """One key's record (None: there is none) as of ``now``, read under the key's mutual exclusion.

    ``put`` stores the record's next version (None: the key holds nothing), while that
    exclusion is still held; ``fences`` issues a run lock's fence (see ``Backend.start``);
    ``drops`` counts a refused duplicate (see ``Backend.duplicates``; None: the store keeps no counts).
    """

    record: Record | None
    now: float
    put: Callable[[Record | None], None]
    fences: Fences
    drops: Drops | None = None


class RecordStore:
    """Mix in before ``LockMachineBackend`` or ``MachineStore``: their hook, from :meth:`_held`."""

    @abstractmethod
    def _held(self, key: str) -> AbstractContextManager[Held]:
        """Hold ``key``'s mutual exclusion and yield its record; the record a transition leaves is put."""

    @contextmanager
    def _lock_machine(self, key: str) -> Iterator[LockMachine]:
        with self._held(key) as held:
            m = LockMachine(key, held.record, held.now, held.fences, held.drops)
            yield m
            if m.changed:
                held.put(m.record())

    @contextmanager
    def _machine(self, key: str) -> Iterator[Machine]:
        with self._held(key) as held:
            m = Machine(key, held.record, held.now)
            yield m
            if m.changed:
                held.put(m.record())
