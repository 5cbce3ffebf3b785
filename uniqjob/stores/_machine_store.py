"""The semaphore contract over one hook: a store that keeps each key as one record, run by :class:`Machine`.

:class:`MachineStore` turns every primitive of
:class:`~uniqjob.stores.semaphores.SemaphoreStore` into one transition of
:class:`~._machine.Machine` on the key's record (holders encoded as the record
keeps them), under the key's mutual exclusion that the store's one hook,
``_machine(key)``, holds.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager

from ..locks import Holder
from ._machine import Machine
from .semaphores import HANDOFF, Outcome, Park, SemaphoreState, SemaphoreStore, encode_holder

__all__ = ["MachineStore"]


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
