"""Lock records, tokens and holder identity.

A key has at most two locks. The **queue lock** lives from enqueue until perform
ends and knows its state (``queued`` / ``running``). The **run lock** lives while
perform runs; its lease is renewed by a heartbeat and names its holder (host,
pid, process start time), so a holder that died can be told from one that is
merely slow.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Coalesced",
    "Holder",
    "LockState",
    "Parts",
    "PendingCall",
    "QueueMeta",
    "QueueRecord",
    "RunClaim",
    "RunRecord",
    "holder_is_dead",
    "local_holder",
    "new_token",
    "orphaned",
]

QUEUED: Literal["queued"] = "queued"
RUNNING: Literal["running"] = "running"


def _draw_token_base() -> None:
    global _token_base, _token_count
    _token_base = os.urandom(8).hex()
    _token_count = itertools.count()


_token_base = ""
_token_count = itertools.count()
_draw_token_base()
# A forked child draws its own base: it must never hand out its parent's tokens.
os.register_at_fork(after_in_child=_draw_token_base)


def new_token() -> str:
    """Return a token no other lock has: the proof of ownership of one lock.

    64 random bits drawn once per process (and again in a forked child), then
    a count: unique without a system call per lock. A token proves ownership
    among cooperating processes; it is not a secret (whoever can read the
    store can read it), so being predictable within one process costs nothing.
    ``next()`` on a count is atomic, so threads never share one.
    """
    return f"{_token_base}{next(_token_count):08x}"


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a run lock.

    ``node`` fingerprints the pid space (boot id and pid namespace): two holders
    with equal ``host`` and ``node`` can check each other's pids.
    """

    host: str
    node: str
    pid: int
    pstart: int = 0  # process start time in clock ticks after boot; 0 if unknown


@dataclass(frozen=True, slots=True)
class QueueMeta:
    """What the queue lock records for humans and for queue integrations."""

    cls: str = ""
    args: str = ""
    job_id: str = ""
    #: The call's arguments as JSON, kept for a policy that runs the latest call ("keep_last").
    call: str = ""


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A call recorded behind a running one (policy "keep_last"), pushed when that run ends."""

    token: str
    meta: QueueMeta


@dataclass(slots=True)
class RunClaim:
    """A request to hold a run lock: who, for how long between beats, and which attempt.

    ``attempt`` tells two deliveries of one job (one token) apart: a live run
    lock of the same token but another attempt is a duplicate delivery.
    ``fence`` is written by the store when it grants the run lock: an integer
    strictly greater than every fence issued for that key before (see
    :meth:`uniqjob.stores.base.Backend.start`). One claim is made per call.
    """

    holder: Holder
    lease: float
    attempt: str = ""
    fence: int = 0
    #: Written by the store with the grant: the latest call's arguments that its queue lock
    #: recorded (policy "keep_last": a duplicate's while it was queued); "" if none.
    call: str = ""


# The two records below are plain (not frozen) slotted dataclasses, built on every
# conflict (why not frozen: docs/performance.md). They are copies: changing one
# changes nothing in the store.


@dataclass(slots=True)
class QueueRecord:
    """The queue lock of a key, as read."""

    token: str
    state: str  # QUEUED or RUNNING
    since: float  # store clock, seconds
    meta: QueueMeta
    ttl: float | None  # seconds left before autoexpire; None: no autoexpire
    pending: PendingCall | None = None  # the call that runs after this one ("keep_last")
    due: float | None = None  # store clock, seconds: its job may not start before (debounce)


@dataclass(slots=True)
class RunRecord:
    """The run lock of a key, as read."""

    token: str
    holder: Holder
    started: float  # store clock, seconds
    lease: float  # seconds
    lease_left: float  # seconds
    fence: int = 0  # the fence issued when this run lock was granted; 0 if the store kept none
    #: Who asked this run to stop, as ``host:pid`` (``uniqjob run --overlap terminate-other``); "" if nobody.
    stop: str = ""


#: What a refused call asked for (see :attr:`LockState.refused`).
Refused = Literal["", "queue", "both", "run"]

#: What the store made of a claim's conflict (see :attr:`LockState.coalesced`).
Coalesced = Literal["", "latest", "pending", "replaced"]

#: What an unread LockState is read with: its queue lock, run lock and clock.
Parts = tuple[QueueRecord | None, RunRecord | None, float]


class LockState:
    """A snapshot of one key's locks, read in one atomic step.

    A store may hand one over unread (:meth:`unread`): its parts are then read
    on first use. The usual duplicate enqueue (a queued lock, nothing
    running, :attr:`nothing_to_reclaim`, or a queued job too young to be asked about,
    :meth:`nothing_to_reclaim_yet`) is rejected without ever reading them (see
    docs/performance.md).
    """

    __slots__ = (
        "_job_age", "_nothing_to_reclaim", "_now", "_queue", "_read", "_run", "coalesced", "key",
        "pending_run", "refused",
    )  # fmt: skip

    def __init__(
        self, key: str, queue: QueueRecord | None, run: RunRecord | None, now: float, pending_run: str = ""
    ) -> None:
        self.key = key
        #: The run waiting to run once the key is free (``uniqjob run --overlap buffer-one``), as
        #: ``host:pid``; "" if none. Only a :meth:`~uniqjob.stores.base.Backend.read` reports it.
        self.pending_run = pending_run
        #: What the call this state refused asked for, set by the JobLock it refused: "queue" (an
        #: enqueue's queue lock), "both" (an inline run's queue and run locks) or "run" (a start);
        #: "" when not known. It tells which of the locks must end for that call (:meth:`clears`).
        self.refused: Refused = ""
        #: What the store made of a refused claim with a policy (Backend.claim): "" nothing,
        #: "latest" (its arguments replace the queued call's), "pending" (it runs after the
        #: running call) or "replaced" (it took the queued call's place: the lock is the caller's).
        self.coalesced: Coalesced = ""
        self._queue = queue
        self._run = run
        self._now = now  # the store's clock when the snapshot was taken
        self._read: Callable[[], Parts] | None = None
        self._nothing_to_reclaim = False  # only an unread state keeps what the store said
        self._job_age: float | None = None

    @classmethod
    def unread(
        cls, key: str, read: Callable[[], Parts], *, nothing_to_reclaim: bool, job_age: float | None = None
    ) -> LockState:
        """A snapshot whose parts ``read()`` returns when first asked for.

        ``nothing_to_reclaim`` is :attr:`nothing_to_reclaim` as the store saw it; ``job_age``, for
        a queued lock with a job id and no run lock, how many seconds ago it was queued.
        """
        state = cls.__new__(cls)
        state.key = key
        state.refused = state.pending_run = state.coalesced = ""
        state._read = read
        state._nothing_to_reclaim = nothing_to_reclaim
        state._job_age = job_age
        return state

    def _parts(self) -> Parts:
        read = self._read
        if read is not None:
            self._queue, self._run, self._now = read()
            self._read = None
        return self._queue, self._run, self._now

    @property
    def queue(self) -> QueueRecord | None:
        """The queue lock, or None."""
        return self._parts()[0] if self._read is not None else self._queue

    @property
    def run(self) -> RunRecord | None:
        """The run lock, or None."""
        return self._parts()[1] if self._read is not None else self._run

    @property
    def now(self) -> float:
        """The store's clock when the snapshot was taken, in seconds."""
        return self._parts()[2] if self._read is not None else self._now

    @property
    def nothing_to_reclaim(self) -> bool:
        """A queued lock with no job id, and no run lock: nothing that anyone may reclaim."""
        if self._read is not None:
            return self._nothing_to_reclaim  # as the store saw it
        queue = self._queue
        return self._run is None and queue is not None and queue.state == QUEUED and not queue.meta.job_id

    def nothing_to_reclaim_yet(self, suspect_after: float | None) -> bool:
        """:attr:`nothing_to_reclaim`, or a queued lock with a job id and no run lock, younger than
        ``suspect_after`` seconds: its queue is not asked about the job yet (the job may not have
        reached it), so nothing may reclaim that lock now either."""
        if self.nothing_to_reclaim:
            return True
        if not suspect_after:
            return False
        if self._read is not None:
            return self._job_age is not None and self._job_age < suspect_after
        queue = self._queue
        return (
            self._run is None
            and queue is not None
            and queue.state == QUEUED
            and self._now - queue.since < suspect_after
        )

    __match_args__ = ("key", "queue", "run", "now")

    def __reduce__(
        self,
    ) -> tuple[type[LockState], tuple[str, QueueRecord | None, RunRecord | None, float, str]]:
        # Read, then copied or pickled as the plain snapshot it is (an unread one holds its store).
        return (LockState, (self.key, *self._parts(), self.pending_run))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LockState):
            return NotImplemented
        return self.key == other.key and self._parts() == other._parts()

    __hash__ = None  # type: ignore[assignment]  # equal by value, and not frozen

    def __repr__(self) -> str:
        queue, run, now = self._parts()
        return f"LockState(key={self.key!r}, queue={queue!r}, run={run!r}, now={now!r})"

    @property
    def free(self) -> bool:
        return self.queue is None and self.run is None

    def describe(self) -> dict[str, object]:
        """Return the facts a person needs about who holds the key."""
        facts: dict[str, object] = {}
        if self.queue is not None:
            facts["state"] = self.queue.state
            facts["since"] = round(self.now - self.queue.since, 3)
            if self.queue.meta.job_id:
                facts["job_id"] = self.queue.meta.job_id
        if self.run is not None:
            facts["host"] = self.run.holder.host
            facts["pid"] = self.run.holder.pid
            facts["running_for"] = round(self.now - self.run.started, 3)
        if self.refused:
            facts["clears_in"], by = self.clears()
            if by:
                facts["clears_by"] = by
        return facts

    def clears(self) -> tuple[float | None, str]:
        """Seconds until the locks that refused the call end as the store recorded them, and what ends them.

        What ends them is ``"autoexpire"`` (the queue lock's ``unique_lock_autoexpire``)
        or ``"lease"`` (the run lock's lease, which its live holder renews: the
        lease ends it only if the holder stops). A queue lock ``running`` ends
        with its run lock's lease too (it is then an orphan). Seconds are the
        store's (its clock, the TTLs it holds), as of this snapshot; ``(None, "")``
        when nothing ends them but their holder (a queued lock without autoexpire).
        """
        queue, run, _ = self._parts()
        wanted = self.refused
        ends: list[tuple[float | None, str]] = []
        if queue is not None and wanted in ("queue", "both"):
            end: tuple[float | None, str] = (queue.ttl, "autoexpire" if queue.ttl is not None else "")
            lapses = queue.state == RUNNING and run is not None and run.token == queue.token
            if lapses and run is not None and (end[0] is None or run.lease_left < end[0]):
                end = (run.lease_left, "lease")
            ends.append(end)
        if run is not None and wanted in ("run", "both"):
            ends.append((run.lease_left, "lease"))
        if not ends or any(seconds is None for seconds, _ in ends):
            return None, ""
        seconds, by = max(ends, key=lambda end: end[0] or 0.0)
        return round(max(seconds or 0.0, 0.0), 3), by


def _pid_start(pid: int) -> int:
    """Return the start time of ``pid`` in clock ticks after boot; 0 if unknown; -1 if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return -1
    except OSError:
        return 0
    # The command name may hold spaces and parentheses: fields restart after the last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return -1  # a zombie has exited; only its parent has yet to reap it
    return int(fields[19])  # field 22 of proc(5), counted from field 3


@functools.cache
def _node() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    try:
        pidns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        pidns = ""
    if not boot:
        # Without a boot id we cannot tell a reboot from a live process: use a
        # value no other process can share, so liveness falls back to the lease.
        return "unknown-" + new_token()
    return hashlib.blake2b(f"{boot}/{pidns}".encode(), digest_size=8).hexdigest()


def _hostname() -> str:
    """``socket.gethostname()``: on POSIX the same name, from uname(2), without loading socket."""
    if hasattr(os, "uname"):
        return os.uname().nodename
    import socket  # pragma: no cover - not POSIX

    return socket.gethostname()  # pragma: no cover


_local: Holder | None = None


def local_holder() -> Holder:
    """Return the identity of the calling process (recomputed in a forked child)."""
    global _local
    pid = os.getpid()
    if _local is None or _local.pid != pid:
        _local = Holder(_hostname(), _node(), pid, max(_pid_start(pid), 0))
    return _local


def holder_is_dead(holder: Holder, me: Holder | None = None) -> bool:
    """Return True only when ``holder`` is provably dead; a holder on another host never is."""
    me = me or local_holder()
    if holder.host != me.host or holder.node != me.node:
        return False  # another pid space: only its lease can tell
    if holder.pid == me.pid:
        return holder.pstart != me.pstart
    start = _pid_start(holder.pid)
    if start == -1:
        return True
    if start == 0 or holder.pstart == 0:
        return not _pid_exists(holder.pid)
    return start != holder.pstart  # the pid was reused by another process


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    return True


def orphaned(state: LockState, me: Holder | None = None) -> bool:
    """Apply the orphan rule: is the lock on this key held by nobody alive?

    A queue lock in state ``running`` whose run lock has lapsed or whose holder
    is provably dead is an orphan. A ``queued`` lock never is: only its queue,
    or autoexpire, can say its job is gone. When in doubt, never delete.
    """
    if state.queue is not None and state.queue.state == QUEUED:
        return False
    if state.run is not None:
        return holder_is_dead(state.run.holder, me)
    return state.queue is not None  # running, and its run lock has lapsed
