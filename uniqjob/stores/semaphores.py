"""The semaphore store contract: a counting semaphore per concurrency key, with a FIFO of parked jobs.

A key holds up to ``limit`` **slots**, each named by the token of the job call
that holds it, and a FIFO list of **parked** calls waiting for one. Every
primitive below is one atomic step (one Lua script on Redis, reading the
server's clock; one read-modify-write under a file lock on disk), and every
one first **settles** the key:

- a slot whose lease lapsed is freed, except a slot *promoted* for a queue and
  not yet handed to it: that one is claimed again by the caller, to push again
  (its promoter died, or took too long);
- a parked call waiting *inline* (a process blocked in ``run()``) whose waiter
  stopped polling is dropped: there is no one left to run it. A call parked for
  a queue has no lease and never ages out;
- free slots are handed to parked calls, oldest first. The call becomes a
  ``promoted`` slot and is returned as a :class:`Promotion`: the caller must
  deliver it (push it to its queue, then call :meth:`SemaphoreStore.handed`).

So the finisher's release, the limit check and the park, and the promotion that
follows them can never interleave: nothing is stranded, nothing passes the
limit. Times are seconds of the store's clock.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Literal, TypeVar

from ..errors import CorruptRecordError
from ..locks import Holder

__all__ = [
    "HANDOFF",
    "TOMBSTONE",
    "Outcome",
    "Park",
    "ParkedInfo",
    "Promotion",
    "SemaphoreState",
    "SemaphoreStore",
    "SlotInfo",
    "decode_holder",
    "encode_holder",
    "read_each",
]

T = TypeVar("T")


def read_each(read: Callable[[str], T], keys: Sequence[str]) -> list[T | CorruptRecordError]:
    """``read(key)`` for each of ``keys``, in order; a :class:`CorruptRecordError` raised in its place.

    (Both store contracts' default batched read.)
    """
    states: list[T | CorruptRecordError] = []
    for key in keys:
        try:
            states.append(read(key))
        except CorruptRecordError as exc:
            states.append(exc)
    return states


#: Seconds a promoter has to hand a promoted job to its queue before anyone may push it again.
HANDOFF = 30.0
#: Seconds a slot that was pushed more than once is remembered after release, so that a late
#: second copy is recognised as done instead of running again.
TOMBSTONE = 24 * 3600.0

Via = Literal["queue", "inline"]
#: reserved: taken at enqueue, job in its queue; promoted: taken from the parked list, being
#: delivered; running: perform is running, its holder beating.
SlotStatus = Literal["reserved", "promoted", "running"]


def encode_holder(holder: Holder | None) -> str:
    """Return the holder as the one text the stores compare; "" for none."""
    if holder is None:
        return ""
    return json.dumps([holder.host, holder.node, holder.pid, holder.pstart], separators=(",", ":"))


def decode_holder(text: str) -> Holder | None:
    """Return the holder stored as ``text`` by :func:`encode_holder`."""
    if not text:
        return None
    host, node, pid, pstart = json.loads(text)
    return Holder(str(host), str(node), int(pid), int(pstart))


@dataclass(frozen=True, slots=True)
class Park:
    """How to park a call that finds the key at its limit.

    ``via="queue"``: ``payload`` (see :mod:`uniqjob.concurrency.codec`) is pushed to
    the job's queue when promoted; the entry never ages out. ``via="inline"``:
    ``holder`` is the process waiting for its turn, which keeps the entry alive
    by polling at least every ``lease`` seconds.
    """

    via: Via
    payload: str = ""
    holder: Holder | None = None
    lease: float = 0.0


@dataclass(frozen=True, slots=True)
class Promotion:
    """A parked call that was just given a slot; the caller of the primitive must deliver it."""

    token: str
    via: Via
    payload: str
    redo: int  # 0: first delivery; more: pushed again after its promoter failed


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """One held slot as read."""

    token: str
    status: SlotStatus
    via: Via
    holder: Holder | None
    since: float
    lease: float
    lease_left: float
    redo: int
    args: str


@dataclass(frozen=True, slots=True)
class ParkedInfo:
    """One parked call as read."""

    token: str
    via: Via
    holder: Holder | None
    since: float
    args: str


@dataclass(frozen=True, slots=True)
class SemaphoreState:
    """A snapshot of one key, read in one atomic step (lapsed leases are shown, not yet freed)."""

    key: str
    limit: int
    job_class: str
    slots: tuple[SlotInfo, ...]
    parked: int
    head: tuple[ParkedInfo, ...]  # the oldest parked calls, oldest first
    now: float

    @property
    def empty(self) -> bool:
        return not self.slots and not self.parked

    @property
    def oldest_wait(self) -> float | None:
        """Seconds the oldest parked call has waited; None if none is parked."""
        return max(self.now - self.head[0].since, 0.0) if self.head else None


Status = Literal[
    "taken", "parked", "full", "run", "busy", "done", "missing", "ok", "gone", "released", "withdrawn", "slot"
]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a primitive did, and the promotions its settling made (to be delivered by the caller)."""

    status: Status
    promotions: tuple[Promotion, ...] = ()
    position: int = 0  # parked: 1-based place in the FIFO
    slots: tuple[SlotInfo, ...] = field(default=())  # full/parked: who holds the key
    holder: Holder | None = None  # busy: who runs it
    count: int = 0  # reap/drop: how many went


class SemaphoreStore(ABC):
    """Where concurrency slots and parked calls live. Each method is one atomic step.

    ``caller`` is the identity of the calling process: a queue promotion made
    by a method is held by it until :meth:`handed`, or until ``handoff``
    seconds pass. Every method settles the key first (see the module docstring).
    """

    name = "store"

    @abstractmethod
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
        """Take a slot for ``token`` (``taken``), else park the call (``parked``), else ``full``.

        Parked calls go first: a free slot goes to the oldest of them, and a new
        call parks behind them. ``limit`` is recorded for the key. The slot is
        ``running`` (held by ``holder``) or ``reserved`` (its job waits in a
        queue); its lease is ``lease`` seconds. A token that already holds a
        slot or a place is told so, unchanged. ``full`` and ``parked`` carry the
        slots in the way, so the caller can check their holders' liveness.
        """

    @abstractmethod
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
        """Mark ``token``'s slot running for ``holder`` (``run``).

        Else: ``busy`` (already running, even in this very process: a second
        delivery; unless its holder is ``takeover``, one proved dead), ``parked``
        (still waiting; a poll by the inline
        waiter itself renews its place), ``done`` (released after being pushed
        twice: this is the late copy) or ``missing`` (no slot: its lease lapsed,
        or an operator dropped it).
        """

    @abstractmethod
    def renew(
        self, key: str, token: str, lease: float, *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        """Extend ``token``'s slot (or inline place) to ``lease`` seconds from now: ``ok`` or ``gone``."""

    @abstractmethod
    def release(self, key: str, token: str, *, caller: Holder, handoff: float = HANDOFF) -> Outcome:
        """Free ``token``'s slot and promote into it (``released``); ``gone`` if it holds none.

        Releasing twice frees nothing the second time: slots are named by token.
        """

    @abstractmethod
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
        """Keep ``token``'s running slot for the job's next attempt (a retry): ``ok``, else ``gone``.

        The slot becomes ``reserved`` again, its lease ``lease`` seconds from
        now, neither freed nor promoted into: the retry carries the same token
        and starts it like any reserved slot. Only a slot running for
        ``holder`` is kept; any other (taken over, lapsed) is ``gone``.
        """

    @abstractmethod
    def handed(self, key: str, token: str, promoter: Holder) -> bool:
        """Mark a queue promotion delivered: ``reserved``, lease restarted. False if not ``promoter``'s."""

    @abstractmethod
    def withdraw(self, key: str, token: str) -> Outcome:
        """Take ``token``'s call off the parked list (``withdrawn``); ``slot`` if promoted; else ``gone``."""

    @abstractmethod
    def reap(
        self,
        key: str,
        dead: Sequence[tuple[str, Holder]],
        *,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> Outcome:
        """Act on holders the caller proved dead, each only while it still holds that token.

        A slot is freed; a queue promotion is claimed again by the caller to
        push again; an inline waiter's place is dropped. ``count`` says how many
        slots and places went.
        """

    @abstractmethod
    def discard_parked(self, key: str) -> list[tuple[str, str]]:
        """Drop every call parked on ``key`` (an operator's decision); return their (token, payload)s."""

    @abstractmethod
    def drop(self, key: str, tokens: Sequence[str], *, caller: Holder, handoff: float = HANDOFF) -> Outcome:
        """Free the slots of ``tokens`` (an operator's decision) and promote into them; ``count`` freed."""

    @abstractmethod
    def read(self, key: str, *, head: int = 5) -> SemaphoreState:
        """Return a snapshot of ``key`` with its ``head`` oldest parked calls."""

    def read_many(self, keys: Sequence[str], *, head: int = 5) -> list[SemaphoreState | CorruptRecordError]:
        """Return :meth:`read` of each of ``keys``, in order; a damaged record's error in its place.

        The concurrency figures read the store a page of keys at a time
        through this. This default calls :meth:`read` for each key; a store
        that can read many keys in one round trip (Redis pipelines them) overrides it.
        """
        return read_each(partial(self.read, head=head), keys)

    @abstractmethod
    def scan(self) -> Iterator[str]:
        """Yield every key that holds a slot or a parked call, streaming."""
