"""The lock state machine over a plain, JSON-ready record.

The memory and file backends keep each key as one such record and run these
transitions under their own mutual exclusion; the Redis backend runs the same
transitions as Lua scripts. The shared contract suite holds them to one meaning.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from ..locks import (
    QUEUED,
    RUNNING,
    Holder,
    LockState,
    QueueMeta,
    QueueRecord,
    RunClaim,
    RunRecord,
)
from .base import Backend, QueueMode

Record = dict[str, Any]

#: Issues a run lock's fence, given the store's clock in whole microseconds (see Backend.start).
Fences = Callable[[int], int]

#: What a field must be: a description for the error, and the test.
Kind = tuple[str, Callable[[object], bool]]


_LARGEST = 2**53  # an int beyond it would lose digits as a float, or not convert at all


def _is_number(value: object) -> bool:
    """A finite float, or an int a float holds exactly (a time, a lease); never a bool."""
    # type(), not isinstance(): a bool is an int to Python, never a time to us.
    # ``x - x == 0.0`` holds for a finite float only (inf - inf and nan - nan are nan).
    if type(value) is float:
        return value - value == 0.0
    return type(value) is int and -_LARGEST <= value <= _LARGEST


TEXT: Kind = ("a string", lambda v: type(v) is str)
NUMBER: Kind = ("a finite number", _is_number)
COUNT: Kind = ("a whole number >= 0", lambda v: type(v) is int and v >= 0)
NUMBER_OR_NULL: Kind = ("null or a finite number", lambda v: v is None or _is_number(v))


def one_of(*values: str) -> Kind:
    """A field that holds one of ``values``."""
    return (" or ".join(map(repr, values)), lambda v: type(v) is str and v in values)


#: Field name -> (its kind, whether it may be missing).
Fields = dict[str, tuple[Kind, bool]]

# A record: {"key": str, "q": queue lock or null, "r": run lock or null}; each lock a flat object.
_QUEUE_FIELDS: Fields = {
    "token": (TEXT, False),
    "state": (one_of(QUEUED, RUNNING), False),
    "since": (NUMBER, False),
    "cls": (TEXT, True),
    "args": (TEXT, True),
    "job_id": (TEXT, True),
    "expires": (NUMBER_OR_NULL, True),
}
_RUN_FIELDS: Fields = {
    "token": (TEXT, False),
    "host": (TEXT, False),
    "node": (TEXT, False),
    "pid": (COUNT, False),
    "pstart": (COUNT, False),
    "started": (NUMBER, False),
    "lease": (NUMBER, False),
    "until": (NUMBER, False),
    "attempt": (TEXT, True),
    "f": (COUNT, True),
}


def fields_problem(value: object, what: str, fields: Fields) -> str:
    """Return what is wrong with ``value``, an object of ``fields`` called ``what``; "" if nothing."""
    if type(value) is not dict:
        return f"{what} is {type(value).__name__} {shown(value)}, expected an object"
    for name, ((expected, fits), optional) in fields.items():
        if name not in value:
            if optional:
                continue
            return f"{what} has no {name!r}"
        if not fits(value[name]):
            return f"{what}'s {name!r} is {shown(value[name])}, expected {expected}"
    return ""


def shown(value: object) -> str:
    """A short repr of a bad value, for an error message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def record_problem(record: Record) -> str:
    """Return what is wrong with a record whose key was read, or "" if every field has its type and shape.

    The transitions index fields freely, so a record is checked once, on read:
    a bad one is a :class:`~uniqjob.errors.CorruptRecordError`, never a
    TypeError half-way through a transition.
    """
    q, r = record.get("q"), record.get("r")
    if (q is None or _sound_queue(q)) and (r is None or _sound_run(r)):
        return ""
    if q is not None and (problem := fields_problem(q, "its queue lock", _QUEUE_FIELDS)):
        return problem
    return "" if r is None else fields_problem(r, "its run lock", _RUN_FIELDS)


# The two checks below say the same as the tables above, of a sound lock, in one
# expression each (a read checks every lock it reads, so this is the hot path);
# only a lock that fails is walked field by field, to say what is wrong.


def _sound_queue(q: Any) -> bool:
    if type(q) is not dict:
        return False
    expires = q.get("expires")
    return (
        type(q.get("token")) is str
        and q.get("state") in (QUEUED, RUNNING)
        and _is_number(q.get("since"))
        and (expires is None or _is_number(expires))
        and type(q.get("cls", "")) is str
        and type(q.get("args", "")) is str
        and type(q.get("job_id", "")) is str
    )


def _sound_run(r: Any) -> bool:
    if type(r) is not dict:
        return False
    pid, pstart, fence = r.get("pid"), r.get("pstart"), r.get("f", 0)
    return (
        type(r.get("token")) is str
        and type(r.get("host")) is str
        and type(r.get("node")) is str
        and type(pid) is int
        and pid >= 0
        and type(pstart) is int
        and pstart >= 0
        and type(fence) is int
        and fence >= 0
        and _is_number(r.get("started"))
        and _is_number(r.get("lease"))
        and _is_number(r.get("until"))
        and type(r.get("attempt", "")) is str
    )


class Slot:
    """One key's locks as of ``now``, with lapsed leases and autoexpired locks dropped.

    ``fences`` issues the fence of a run lock this slot grants (see :meth:`Backend.start`).
    """

    def __init__(self, key: str, record: Record | None, now: float, fences: Fences | None = None) -> None:
        self.key = key
        self.now = now
        self.fences = fences
        self.q: Record | None = None
        self.r: Record | None = None
        self.changed = False
        if record:
            self.q = record.get("q")
            self.r = record.get("r")
        if self.q is not None and self.q.get("expires") is not None and self.q["expires"] <= now:
            self.q, self.changed = None, True
        if self.r is not None and self.r["until"] <= now:
            self.r, self.changed = None, True

    # -- reading -------------------------------------------------------------------

    def state(self) -> LockState:
        queue = run = None
        if self.q is not None:
            q = self.q
            expires = q.get("expires")
            queue = QueueRecord(
                token=q["token"],
                state=q["state"],
                since=q["since"],
                meta=QueueMeta(q.get("cls", ""), q.get("args", ""), q.get("job_id", "")),
                ttl=None if expires is None else expires - self.now,
            )
        if self.r is not None:
            r = self.r
            run = RunRecord(
                token=r["token"],
                holder=Holder(r["host"], r["node"], r["pid"], r["pstart"]),
                started=r["started"],
                lease=r["lease"],
                lease_left=r["until"] - self.now,
                fence=r.get("f", 0),
            )
        return LockState(self.key, queue, run, self.now)

    def record(self) -> Record | None:
        """Return the record to store, or None when the key holds no lock."""
        if self.q is None and self.r is None:
            return None
        return {"key": self.key, "q": self.q, "r": self.r}

    # -- transitions ---------------------------------------------------------------

    def _set_queue(self, token: str, state: str, meta: QueueMeta, ttl: float | None) -> None:
        self.q = {
            "token": token,
            "state": state,
            "since": self.now,
            "cls": meta.cls,
            "args": meta.args,
            "job_id": meta.job_id,
            "expires": None if ttl is None else self.now + ttl,
        }
        self.changed = True

    def _set_run(self, token: str, claim: RunClaim) -> None:
        """Grant (or re-take, for the same token and attempt) the run lock, and set ``claim.fence``."""
        h = claim.holder
        if self.r is not None and self.r["token"] == token:
            started, fence = self.r["started"], self.r.get("f", 0)  # a re-take keeps its run's fence
        else:
            started, fence = self.now, 0
        if not fence and self.fences is not None:
            fence = self.fences(int(self.now * 1_000_000))
        claim.fence = fence
        self.r = {
            "token": token,
            "host": h.host,
            "node": h.node,
            "pid": h.pid,
            "pstart": h.pstart,
            "started": started,
            "lease": claim.lease,
            "until": self.now + claim.lease,
            "attempt": claim.attempt,
            "f": fence,
        }
        self.changed = True

    def _retakes(self, token: str, run: RunClaim) -> bool:
        """Whether ``run`` may take the run lock: none is held, or this token's, by this attempt."""
        r = self.r
        return r is None or (r["token"] == token and r.get("attempt", "") in ("", run.attempt))

    def _other_delivery(self, token: str, attempt: str) -> bool:
        """Whether the run lock is ``token``'s but not ``attempt``'s: a second, live delivery of one job.

        A lock that names no attempt, or a caller that has none (""), is never another's.
        """
        r = self.r
        if not attempt or r is None or r["token"] != token:
            return False
        return r.get("attempt", "") not in ("", attempt)

    def claim(self, token: str, meta: QueueMeta, ttl: float | None, run: RunClaim | None) -> LockState | None:
        if self.q is not None:
            if self.q["state"] == RUNNING and self.r is None:
                self.q, self.changed = None, True  # orphan: its holder stopped beating
            elif self.q["token"] != token:
                return self.state()
            elif run is None:
                return None  # our own claim, retried after a lost reply: it holds already
            elif self._retakes(token, run):
                self._set_run(token, run)  # the same run's fence, or a first one
                if self.q["state"] != RUNNING:
                    self.q = {**self.q, "state": RUNNING}
                return None
            else:
                return self.state()
        if run is not None:
            if self.r is not None:
                return self.state()
            self._set_queue(token, RUNNING, meta, ttl)
            self._set_run(token, run)
        else:
            self._set_queue(token, QUEUED, meta, ttl)
        return None

    def start(
        self,
        token: str,
        run: RunClaim,
        meta: QueueMeta,
        ttl: float | None,
        *,
        adopt: bool,
        queue: QueueMode,
    ) -> LockState | None:
        if not self._retakes(token, run):
            return self.state()
        self._set_run(token, run)
        mine = self.q is not None and (self.q["token"] == token or adopt)
        if queue == "run":
            if self.q is None:
                self._set_queue(token, RUNNING, meta, ttl)
            elif mine:
                self.q = {**self.q, "token": token, "state": RUNNING}
        elif queue == "release" and mine:
            self.q = None
        return None

    def attach(self, token: str, job_id: str) -> bool:
        if self.q is None or self.q["token"] != token:
            return False
        self.q = {**self.q, "job_id": job_id}
        self.changed = True
        return True

    def requeue(self, token: str, meta: QueueMeta, ttl: float | None, attempt: str = "") -> bool:
        if self._other_delivery(token, attempt):
            return False  # the run, and its queue lock, are a live delivery's: not ours to settle
        if self.r is not None and self.r["token"] == token:
            self.r, self.changed = None, True
        if self.q is not None and self.q["token"] != token:
            if self.q["state"] != RUNNING or self.r is not None:
                return False
            self.q = None  # an orphan: its holder is gone
        expires = None if ttl is None else self.now + ttl
        if self.q is None:
            self._set_queue(token, QUEUED, meta, ttl)
        else:
            self.q = {**self.q, "state": QUEUED, "expires": expires}
        self.changed = True
        return True

    def renew(self, token: str, lease: float, attempt: str = "") -> bool:
        if self.r is None or self.r["token"] != token or self._other_delivery(token, attempt):
            return False
        self.r = {**self.r, "lease": lease, "until": self.now + lease}
        self.changed = True
        return True

    def finish(self, token: str, keep_queue: bool, attempt: str = "") -> None:
        if self._other_delivery(token, attempt):
            return  # both locks are a live delivery's: see Backend.finish
        if self.r is not None and self.r["token"] == token:
            self.r, self.changed = None, True
        if not keep_queue and self.q is not None and self.q["token"] == token:
            self.q, self.changed = None, True

    def dequeue(self, token: str | None) -> bool:
        if self.q is None or self.q["state"] != QUEUED:
            return False
        if token is not None and self.q["token"] != token:
            return False
        self.q, self.changed = None, True
        return True

    def reclaim(self, queue_token: str | None, run_token: str | None) -> bool:
        gone = False
        if queue_token is not None and self.q is not None and self.q["token"] == queue_token:
            self.q, gone = None, True
        if run_token is not None and self.r is not None and self.r["token"] == run_token:
            self.r, gone = None, True
        self.changed |= gone
        return gone


class SlotBackend(Backend):
    """A backend that keeps each key as one record and runs :class:`Slot` transitions on it.

    Subclasses provide :meth:`_slot`: a context manager that holds the key's
    mutual exclusion, yields its slot and stores the record if it changed.
    """

    @abstractmethod
    def _slot(self, key: str) -> AbstractContextManager[Slot]: ...

    def claim(
        self,
        key: str,
        token: str,
        *,
        meta: QueueMeta,
        ttl: float | None = None,
        run: RunClaim | None = None,
    ) -> LockState | None:
        with self._slot(key) as slot:
            return slot.claim(token, meta, ttl, run)

    def start(
        self,
        key: str,
        token: str,
        *,
        run: RunClaim,
        meta: QueueMeta,
        ttl: float | None = None,
        adopt: bool = False,
        queue: QueueMode = "run",
    ) -> LockState | None:
        with self._slot(key) as slot:
            return slot.start(token, run, meta, ttl, adopt=adopt, queue=queue)

    def attach(self, key: str, token: str, job_id: str) -> bool:
        with self._slot(key) as slot:
            return slot.attach(token, job_id)

    def requeue(self, key: str, token: str, *, meta: QueueMeta, ttl: float | None, attempt: str = "") -> bool:
        with self._slot(key) as slot:
            return slot.requeue(token, meta, ttl, attempt)

    def renew(self, key: str, token: str, lease: float, attempt: str = "") -> bool:
        with self._slot(key) as slot:
            return slot.renew(token, lease, attempt)

    def finish(self, key: str, token: str, *, keep_queue: bool = False, attempt: str = "") -> None:
        with self._slot(key) as slot:
            slot.finish(token, keep_queue, attempt)

    def dequeue(self, key: str, token: str | None = None) -> bool:
        with self._slot(key) as slot:
            return slot.dequeue(token)

    def reclaim(self, key: str, queue_token: str | None, run_token: str | None) -> bool:
        with self._slot(key) as slot:
            return slot.reclaim(queue_token, run_token)

    def read(self, key: str) -> LockState:
        with self._slot(key) as slot:
            return slot.state()
