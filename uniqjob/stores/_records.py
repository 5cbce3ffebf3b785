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
#: Counts ``n`` dropped duplicates (-1: takes one back) of a job class at a store time (Backend.duplicates).
Drops = Callable[[str, float, int], None]


class Slot:
    """One key's locks as of ``now``, with lapsed leases and autoexpired locks dropped.

    ``fences`` issues the fence of a run lock this slot grants (see :meth:`Backend.start`);
    ``drops`` counts the duplicates it refuses (see :meth:`Backend.duplicates`; None: not counted).
    """

    def __init__(
        self,
        key: str,
        record: Record | None,
        now: float,
        fences: Fences | None = None,
        drops: Drops | None = None,
    ) -> None:
        self.key = key
        self.now = now
        self.fences = fences
        self.drops = drops
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

    def tally(
        self, token: str, cls: str, refused: LockState | None, count: bool, counted: float | None
    ) -> None:
        """Count a refused call as a duplicate, or take back its earlier count once granted.

        See :meth:`Backend.duplicates`.
        """
        drops = self.drops
        if drops is None:
            return
        if refused is None:
            if counted is not None:
                drops(cls, counted, -1)
        elif count and counted is None and not (self.r is not None and self.r["token"] == token):
            drops(cls, self.now, 1)

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
        count: bool = False,
        counted: float | None = None,
    ) -> LockState | None:
        with self._slot(key) as slot:
            state = slot.claim(token, meta, ttl, run)
            slot.tally(token, meta.cls, state, count, counted)
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
        queue: QueueMode = "run",
        count: bool = False,
        counted: float | None = None,
    ) -> LockState | None:
        with self._slot(key) as slot:
            state = slot.start(token, run, meta, ttl, adopt=adopt, queue=queue)
            slot.tally(token, meta.cls, state, count, counted)
            return state

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
