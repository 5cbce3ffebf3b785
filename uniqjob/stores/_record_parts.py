"""A lock record's parts as the library reads them: its queue lock, run lock and pending call.

The record is :mod:`._records`' (the memory and file stores' one record per key).
"""

from __future__ import annotations

from typing import Any

from ..locks import Holder, Parts, PendingCall, QueueMeta, QueueRecord, RunRecord

__all__ = ["FOLLOWS", "PENDING", "Record", "parts", "pending"]

Record = dict[str, Any]


def parts(q: Record | None, r: Record | None, now: float) -> Parts:
    """The queue lock, run lock and clock of a key whose records are ``q`` and ``r`` at ``now``."""
    queue = run = None
    if q is not None:
        expires = q.get("expires")
        cls = q.get("cls", "")
        queue = QueueRecord(
            token=q["token"],
            state=q["state"],
            since=q["since"],
            meta=QueueMeta(cls, q.get("args", ""), q.get("job_id", ""), q.get("call", "")),
            ttl=None if expires is None else expires - now,
            pending=pending(q),
            due=q.get("due"),
        )
    if r is not None:
        run = RunRecord(
            token=r["token"],
            holder=Holder(r["host"], r["node"], r["pid"], r["pstart"]),
            started=r["started"],
            lease=r["lease"],
            lease_left=r["until"] - now,
            fence=r.get("f", 0),
            stop=r.get("stop", ""),
        )
    return queue, run, now


def pending(q: Record) -> PendingCall | None:
    """The pending call a queue lock record holds (see Backend.claim's coalescing), or None."""
    token = q.get("p_token")
    if not token:
        return None
    return PendingCall(token, QueueMeta("", q.get("p_args", ""), q.get("p_job_id", ""), q.get("p_call", "")))


#: Marks the token of a pending call's queued lock (see LockMachine.finish; _lua_settle.FINISH too).
FOLLOWS = "+"

#: A queue lock record's fields of a pending call.
PENDING = ("p_token", "p_args", "p_job_id", "p_call")
