"""The lock state machine over a plain, JSON-ready record.

The memory and file backends keep each key as one such record and run these
transitions under their own mutual exclusion; the Redis backend runs the same
transitions as Lua scripts. The shared contract suite holds them to one meaning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

from ..errors import ConfigurationError
from ..locks import QUEUED, RUNNING, LockState, PendingCall, QueueMeta, RunClaim
from ._drops import kind_of
from ._schema import FOLLOWS, PENDING, Record, parts, pending
from .base import Coalesce, Debounce, Overlap, OverlapMode, QueueMode

#: Issues a run lock's fence, given the store's clock in whole microseconds (see Backend.start).
Fences = Callable[[int], int]
#: Counts ``n`` refused calls (-1: takes one back) of a job class at a store time, of a kind
#: ("" dropped, "c" coalesced, "r" replaced: see Backend.drops).
Drops = Callable[[str, float, int, str], None]


class LockMachine:
    """One key's locks as of ``now``, with lapsed leases and autoexpired locks dropped.

    ``fences`` issues the fence of a run lock this machine grants (see :meth:`Backend.start`);
    a machine made without one can read and release, and refuses to grant a run lock.
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
        record = record or {}
        self.q: Record | None = record.get("q")
        self.r: Record | None = record.get("r")
        self.o: Record | None = record.get("o")  # the pending run of `uniqjob run --overlap`: see overlap()
        self.changed = False
        if self.q is not None and self.q.get("expires") is not None and self.q["expires"] <= now:
            self.q, self.changed = None, True
        if self.r is not None and self.r["until"] <= now:
            self.r, self.changed = None, True
        if self.o is not None and self.o["u"] <= now:
            self.o, self.changed = None, True

    # -- reading -------------------------------------------------------------------

    def state(self) -> LockState:
        pending = self._pending()
        return LockState(
            self.key, *parts(self.q, self.r, self.now), pending["h"] if pending is not None else ""
        )

    def _pending(self) -> Record | None:
        """The pending run, unless it lapsed or holds the run lock itself now (then it is pending no more)."""
        o, r = self.o, self.r
        return None if o is None or not o["p"] or (r is not None and r["token"] == o["p"]) else o

    def _refused(self) -> LockState:
        """The state that refuses a claim; the usual duplicate's (queued, no job id, no run lock) unread.

        As the Redis store leaves it (docs/performance.md): nothing can be reclaimed, so
        the caller reads its parts only to report them. The records are never changed in
        place (a transition replaces them), so they are read later as they are now.
        """
        q = self.q
        if self.r is None and q is not None and q["state"] == QUEUED and not q.get("job_id"):
            return LockState.unread(self.key, partial(parts, q, None, self.now), nothing_to_reclaim=True)
        return self.state()

    def record(self) -> Record | None:
        """Return the record to store, or None when the key holds no lock."""
        if self.q is None and self.r is None and self.o is None:
            return None
        record = {"key": self.key, "q": self.q, "r": self.r}
        return record if self.o is None else {**record, "o": self.o}

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
        marks: Record = {}
        if self.r is not None and self.r["token"] == token:
            started, fence = self.r["started"], self.r.get("f", 0)  # a re-take keeps its run's fence
            marks = {k: v for k, v in self.r.items() if k in ("stop", "owed")}  # and its run's marks
        else:
            started, fence = self.now, 0
        if not fence:
            fence = self._issue()
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
            **marks,
        }
        self.changed = True

    def _issue(self) -> int:
        """A new fence from ``fences``; a store that gave none, or whose issuer gave no fence, is an error."""
        if self.fences is None:
            raise ConfigurationError(
                f"the lock machine of {self.key!r} has no fence issuer, so it cannot grant a run lock: "
                "a store's _lock_machine hook passes fences=, a callable issuing each fence "
                "(README: Writing a store)"
            )
        fence = self.fences(int(self.now * 1_000_000))
        if type(fence) is not int or fence < 1:
            raise ConfigurationError(
                f"the fence issuer of the lock machine of {self.key!r} returned {fence!r}: "
                "a fence is a whole number > 0, greater than every fence issued before for the key"
            )
        return fence

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

    def claim(
        self,
        token: str,
        meta: QueueMeta,
        ttl: float | None,
        run: RunClaim | None,
        *,
        coalesce: Coalesce = "",
        debounce: Debounce | None = None,
    ) -> LockState | None:
        if self.q is not None:
            if self.q["state"] == RUNNING and self.r is None:
                self.q, self.changed = None, True  # orphan: its holder stopped beating
            elif self.q["token"] != token:
                return self._coalesce(token, meta, coalesce, debounce) if coalesce else self._refused()
            elif run is None:
                return None  # our own claim, retried after a lost reply: it holds already
            elif self._retakes(token, run):
                attempt = run.attempt if self.r is None else self.r.get("attempt", "")
                self._set_run(token, run)  # the same run's fence (and attempt), or a first one
                if self.r is not None:
                    self.r["attempt"] = attempt
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
            if debounce is not None and self.q is not None:
                self.q["due"] = self.now + debounce[0]
        return None

    def _coalesce(
        self, token: str, meta: QueueMeta, coalesce: Coalesce, debounce: Debounce | None
    ) -> LockState:
        """A claim's conflict with another token's live queue lock, coalesced (see Backend.claim)."""
        q = self.q
        assert q is not None
        state = self.state()
        if q["state"] == QUEUED:
            if coalesce == "keep_last":
                kept = {k: v for k, v in q.items() if k not in PENDING}
                self.q = {**kept, "args": meta.args, "call": meta.call}
                self.q.pop("due", None)
                if debounce is not None:  # pushed back, but never past the longest wait
                    wait, longest = debounce
                    due = self.now + wait
                    self.q["due"] = due if longest is None else min(due, q["since"] + longest)
                state = self.state()  # the queued lock as this call left it (as Redis answers)
                state.coalesced = "latest"
            else:
                mine = {"token": token, "since": self.now, "args": meta.args, "job_id": meta.job_id}
                was = {"token": q["token"], "args": q.get("args", ""), "job_id": q.get("job_id", "")}
                self.q = {**{k: v for k, v in q.items() if k not in ("call", "by")}, **mine, "was": was}
                state.coalesced = "replaced"
        elif coalesce == "keep_last":
            pending = {"p_token": token, "p_args": meta.args, "p_job_id": meta.job_id, "p_call": meta.call}
            self.q = {**q, **pending}
            state.coalesced = "pending"
        else:
            return state
        self.changed = True
        return state

    def start(
        self,
        token: str,
        run: RunClaim,
        meta: QueueMeta,
        ttl: float | None,
        *,
        adopt: bool,
        queue_lock: QueueMode,
    ) -> LockState | None:
        if not self._retakes(token, run):
            return self.state()
        mine = self.q is not None and (self.q["token"] == token or adopt)
        own = queue_lock == "own"
        if own:
            expired = self.q is None and ttl is not None  # its lock autoexpired while it waited: it runs
            if not (mine or expired) or (self.q is not None and self.q.get("due", self.now) > self.now):
                return self.state()  # replaced, taken over, or not yet due
            queue_lock = "run"
        self._set_run(token, run)
        run.call = self.q.get("call", "") if mine and self.q is not None else ""
        if queue_lock == "run":
            if self.q is None:
                self._set_queue(token, RUNNING, meta, None if own else ttl)
            elif mine:
                self.q = {**{k: v for k, v in self.q.items() if k != "was"}, "token": token, "state": RUNNING}
            if own and self.q is not None:  # kept as long as its run (a pending call waits in it)
                self.q = {**self.q, "expires": None}
        elif queue_lock == "release" and mine:
            self.q = None
        return None

    def tally(
        self, token: str, cls: str, refused: LockState | None, count: bool, counted: float | None
    ) -> None:
        """Count a refused call as a duplicate, or take back its earlier count once granted.

        See :meth:`Backend.drops`.
        """
        drops = self.drops
        if drops is None:
            return
        if refused is None:
            if counted is not None:
                drops(cls, counted, -1, "")
        elif count and counted is None and not (self.r is not None and self.r["token"] == token):
            drops(cls, self.now, 1, kind_of(refused.coalesced))

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
            self.q = {**{k: v for k, v in self.q.items() if k != "by"}, "state": QUEUED, "expires": expires}
        self.changed = True
        return True

    def renew(self, token: str, lease: float, attempt: str = "") -> bool:
        if self.r is None or self.r["token"] != token or self._other_delivery(token, attempt):
            return False
        if self.r.get("stop"):
            return False  # its holder was asked to stop: see Backend.overlap
        self.r = {**self.r, "lease": lease, "until": self.now + lease}
        self.changed = True
        return True

    def finish(self, token: str, keep_queue: bool, attempt: str = "") -> PendingCall | None:
        if self._other_delivery(token, attempt):
            return None  # both locks are a live delivery's: see Backend.finish
        if self.r is not None and self.r["token"] == token:
            self.r, self.changed = None, True
        q = self.q
        if keep_queue or q is None:
            return None
        if q["token"] != token:  # a retry after a lost reply: the pending call it queued, again
            return self._queued_by(f"{token} {attempt}")
        self.q, self.changed = None, True
        waited = pending(q)
        if waited is None:
            return None
        # The call that waited behind this one: queued now, for the caller to push, under a token
        # of its own (its claim's, marked): an undo of that claim (its reply lost) leaves this
        # lock, whose job its caller pushes, alone.
        call = PendingCall(waited.token + FOLLOWS, waited.meta)
        self._set_queue(call.token, QUEUED, replace(call.meta, cls=q.get("cls", "")), None)
        assert self.q is not None
        self.q.update(call=call.meta.call, by=f"{token} {attempt}")  # (see _queued_by)
        return call

    def _queued_by(self, by: str) -> PendingCall | None:
        """The pending call that a finish queued, while it waits in its queue; else None.

        ``by``: the token and attempt of that finish. Only its own retry gets the call again:
        another release of the same token (a redelivery, a revoke, ``uniqjob reap``) does not,
        so a call is never handed on twice.
        """
        q = self.q
        if q is None or q.get("by") != by or q["state"] != QUEUED:
            return None
        meta = QueueMeta("", q.get("args", ""), q.get("job_id", ""), q.get("call", ""))
        return PendingCall(q["token"], meta)

    def dequeue(self, token: str | None) -> bool:
        if self.q is None or self.q["state"] != QUEUED:
            return False
        if token is not None and self.q["token"] != token:
            return False
        self._drop_queue()
        return True

    def _drop_queue(self) -> None:
        """Drop the queue lock; one that replaced a call not yet started (its undo) gives it back."""
        q, self.q, self.changed = self.q, None, True
        if q is not None and "was" in q:  # (dropped when its call starts)
            self.q = {**{k: v for k, v in q.items() if k != "was"}, **q["was"]}

    def overlap(self, token: str, mode: OverlapMode, lease: float, holder: str) -> Overlap:
        """See :meth:`Backend.overlap`; ``holder`` is the caller as ``host:pid``.

        The key's pending run is the record's ``o``: ``p`` its token ("" once it took the key while
        a run watched it: ``w`` then tells that run), ``h`` its holder, ``u`` until when its place
        holds, ``w`` the token of the run whose holder watches it take the key (``"follow"``). On
        the run lock: ``stop``, who asked it to stop; ``owed``, set when a run coalesced into the
        pending run while it held the key. The Redis store's OVERLAP script (redis/_overlap.py)
        is the same machine.
        """
        q, r, o = self.q, self.r, self.o
        p, w = ("", "") if o is None else (o["p"], o.get("w", ""))
        if mode == "withdraw":
            if o is not None and p == token:
                ran = w and r is not None and r["token"] == token  # it took the key: tell who waits for that
                self.o = {"p": "", "h": "", "u": self.now + lease, "w": w} if ran else None
                self.changed = True
            return "free"
        if mode == "follow":
            return self._follow(token)
        orphan = q is not None and q["state"] == RUNNING and r is None
        theirs = r is not None and r["token"] != token
        busy = (q is not None and not orphan and q["token"] != token) or theirs
        if mode == "terminate":
            if r is not None and r["token"] != token:
                if not r.get("stop"):
                    self.r, self.changed = {**r, "stop": holder}, True
                return "stopping"
            return "busy" if busy else "free"
        if p and p != token and (r is None or r["token"] != p):  # another run is pending
            if r is not None:  # its holder runs once more if need be (see _follow)
                self.r, self.changed = {**r, "owed": holder}, True
            return "coalesced"
        if not busy:
            return "free"
        self.o, self.changed = {**(o or {}), "p": token, "h": holder, "u": self.now + lease}, True
        return "pending"

    def _follow(self, token: str) -> Overlap:
        """``"follow"``: does the run of ``token``, which ends, owe the runs coalesced behind it a run?"""
        r, o = self.r, self.o
        p, w = ("", "") if o is None else (o["p"], o.get("w", ""))
        if r is not None and r["token"] == token:  # it still holds the key: a run waits, or runs coalesced?
            if o is not None and p and p != token:
                self.o, self.changed = {**o, "w": token}, True  # watch the pending run take the key
                return "coalesced"
            return "pending" if r.get("owed") else "free"
        if w != token or o is None:
            return "pending"  # the pending run it watched is gone: the run is the caller's to give
        if p and r is None:
            return "coalesced"  # it still waits
        # a run holds the key (started after ours: the pending run, or another), or the pending run ran
        self.o, self.changed = ({k: v for k, v in o.items() if k != "w"} if p else None), True
        return "free"

    def reclaim(self, queue_token: str | None, run_token: str | None) -> bool:
        gone = False
        if queue_token is not None and self.q is not None and self.q["token"] == queue_token:
            self._drop_queue()
            gone = True
        if run_token is not None and self.r is not None and self.r["token"] == run_token:
            self.r, gone = None, True
        self.changed |= gone
        return gone
