"""The record-machine templates: the bases of a store that keeps one record per key.

:class:`LockMachineBackend` (locks, :class:`~._records.LockMachine` transitions) and
:class:`MachineStore` (semaphores, :class:`~._machine.Machine` transitions) are each a
contract over one hook, which a store written in Python implements (README "Writing a
store"). :class:`RecordStore` turns one hook of its own, ``_held``, into both, so the memory
and file stores keep their records in one place for their locks and their semaphores alike.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import NamedTuple

from ..locks import Holder, LockState, PendingCall, QueueMeta, RunClaim
from ._machine import Machine
from ._records import Drops, Fences, LockMachine
from ._schema import Record
from .base import Backend, Coalesce, Debounce, Overlap, OverlapMode, QueueMode
from .semaphores import HANDOFF, Outcome, Park, SemaphoreState, SemaphoreStore, encode_holder

__all__ = ["Held", "LockMachineBackend", "MachineStore", "RecordStore"]


class LockMachineBackend(Backend):
    """A backend that keeps each key as one record and runs :class:`LockMachine` transitions on it.

    Subclasses provide :meth:`_lock_machine`: a context manager that holds the
    key's mutual exclusion, yields its machine and stores the record if it changed.
    """

    @abstractmethod
    def _lock_machine(self, key: str) -> AbstractContextManager[LockMachine]: ...

    def claim(
        self,
        key: str,
        token: str,
        *,
        meta: QueueMeta,
        ttl: float | None = None,
        run: RunClaim | None = None,
        count: bool = False,
        counted: float | None = None,
        coalesce: Coalesce = "",
        debounce: Debounce | None = None,
    ) -> LockState | None:
        with self._lock_machine(key) as m:
            state = m.claim(token, meta, ttl, run, coalesce=coalesce, debounce=debounce)
            m.tally(token, meta.cls, state, count, counted)
            return state

    def start(
        self,
        key: str,
        token: str,
        *,
        run: RunClaim,
        meta: QueueMeta,
        ttl: float | None = None,
        adopt: bool = False,
        queue_lock: QueueMode = "run",
        count: bool = False,
        counted: float | None = None,
    ) -> LockState | None:
        with self._lock_machine(key) as m:
            state = m.start(token, run, meta, ttl, adopt=adopt, queue_lock=queue_lock)
            m.tally(token, meta.cls, state, count, counted)
            return state

    def attach(self, key: str, token: str, job_id: str) -> bool:
        with self._lock_machine(key) as m:
            return m.attach(token, job_id)

    def requeue(self, key: str, token: str, *, meta: QueueMeta, ttl: float | None, attempt: str = "") -> bool:
        with self._lock_machine(key) as m:
            return m.requeue(token, meta, ttl, attempt)

    def renew(self, key: str, token: str, lease: float, attempt: str = "") -> bool:
        with self._lock_machine(key) as m:
            return m.renew(token, lease, attempt)

    def finish(
        self, key: str, token: str, *, keep_queue: bool = False, attempt: str = ""
    ) -> PendingCall | None:
        with self._lock_machine(key) as m:
            return m.finish(token, keep_queue, attempt)

    def dequeue(self, key: str, token: str | None = None) -> bool:
        with self._lock_machine(key) as m:
            return m.dequeue(token)

    def overlap(self, key: str, token: str, mode: OverlapMode, *, lease: float, holder: Holder) -> Overlap:
        with self._lock_machine(key) as m:
            return m.overlap(token, mode, lease, f"{holder.host}:{holder.pid}")

    def reclaim(self, key: str, queue_token: str | None, run_token: str | None) -> bool:
        with self._lock_machine(key) as m:
            return m.reclaim(queue_token, run_token)

    def read(self, key: str) -> LockState:
        with self._lock_machine(key) as m:
            return m.state()


class MachineStore(SemaphoreStore):
    """A store that keeps each key as one record and runs :class:`Machine` transitions on it."""

    def acquire(
        self,
        key: str,
        token: str,
        *,
        limit: int,
        lease: float,
        running: bool,
        holder: Holder | None,
        park: Park | None,
        job_class: str,
        args: str,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> Outcome:
        with self._machine(key) as m:
            return m.acquire(
                token, limit=limit, lease=lease, running=running, holder=encode_holder(holder), park=park,
                job_class=job_class, args=args, caller=encode_holder(caller), handoff=handoff,
            )  # fmt: skip

    def start(
        self,
        key: str,
        token: str,
        *,
        holder: Holder,
        lease: float,
        takeover: Holder | None,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> Outcome:
        with self._machine(key) as m:
            return m.start(
                token, holder=encode_holder(holder), lease=lease, takeover=encode_holder(takeover),
                caller=encode_holder(caller), handoff=handoff,
            )  # fmt: skip

    def renew(
        self, key: str, token: str, lease: float, *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        with self._machine(key) as m:
            return m.renew(token, lease, encode_holder(caller), handoff)

    def release(self, key: str, token: str, *, caller: Holder, handoff: float = HANDOFF) -> Outcome:
        with self._machine(key) as m:
            return m.release(token, encode_holder(caller), handoff)

    def requeue(
        self,
        key: str,
        token: str,
        lease: float,
        *,
        holder: Holder,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> Outcome:
        with self._machine(key) as m:
            return m.requeue(token, lease, encode_holder(holder), encode_holder(caller), handoff)

    def handed(self, key: str, token: str, promoter: Holder) -> bool:
        with self._machine(key) as m:
            return m.handed(token, encode_holder(promoter))

    def withdraw(self, key: str, token: str) -> Outcome:
        with self._machine(key) as m:
            return m.withdraw(token)

    def reap(
        self, key: str, dead: Sequence[tuple[str, Holder]], *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        with self._machine(key) as m:
            return m.reap([(t, encode_holder(h)) for t, h in dead], encode_holder(caller), handoff)

    def discard_parked(self, key: str) -> list[tuple[str, str]]:
        with self._machine(key) as m:
            return m.discard_parked()

    def drop(self, key: str, tokens: Sequence[str], *, caller: Holder, handoff: float = HANDOFF) -> Outcome:
        with self._machine(key) as m:
            return m.drop(tokens, encode_holder(caller), handoff)

    def read(self, key: str, *, head: int = 5) -> SemaphoreState:
        with self._machine(key) as m:  # reading changes nothing: nothing is written
            return m.state(head)

    @abstractmethod
    def _machine(self, key: str) -> AbstractContextManager[Machine]:
        """Hold the key's mutual exclusion, yield its machine, store the record if it changed."""


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
