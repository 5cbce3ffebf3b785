"""What a sound record holds, for the stores that keep plain JSON-ready records (memory, file).

:func:`lock_problem` checks a lock record (``{"key", "q", "r"}``, see
``_records.py``) and :func:`semaphore_problem` a semaphore record (see
``_machine.py``), once, on read: a transition then never meets a field of the
wrong type half-way (a TypeError, never the :class:`~uniqjob.errors.CorruptRecordError` it is).
:func:`parts` and :func:`pending` read a lock record's queue lock, run lock and
pending call as the library's objects.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..locks import QUEUED, RUNNING, Holder, Parts, PendingCall, QueueMeta, QueueRecord, RunRecord

__all__ = ["FOLLOWS", "PENDING", "Record", "lock_problem", "parts", "pending", "semaphore_problem"]

Record = dict[str, Any]

#: Marks the token of a pending call's queued lock (see LockMachine.finish; _lua_settle.FINISH too).
FOLLOWS = "+"

#: A queue lock record's fields of a pending call.
PENDING = ("p_token", "p_args", "p_job_id", "p_call")

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
    # coalescing (Backend.claim): the latest call's arguments, and a pending call's fields
    **{name: (TEXT, True) for name in ("call", *PENDING)},
    "due": (NUMBER, True),
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
    "stop": (TEXT, True),
    "owed": (TEXT, True),  # a run owed after this one, to the runs coalesced meanwhile (Backend.overlap)
}
# The pending run of `uniqjob run --overlap buffer-one` (Backend.overlap): token, holder, until.
_PENDING_FIELDS: Fields = {"p": (TEXT, False), "h": (TEXT, False), "u": (NUMBER, False), "w": (TEXT, True)}


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


def lock_problem(record: Record) -> str:
    """Return what is wrong with a lock record whose key was read; "" if every field is sound."""
    for name, what, fields in (
        ("o", "its pending run", _PENDING_FIELDS),
        ("q", "its queue lock", _QUEUE_FIELDS),
        ("r", "its run lock", _RUN_FIELDS),
    ):
        value = record.get(name)
        if value is not None and (problem := fields_problem(value, what, fields)):
            return problem
    return ""


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


# -- semaphore records ------------------------------------------------------------


def _is_holder(text: object) -> bool:
    """Whether ``text`` is what :func:`encode_holder` makes: "" or ``[host, node, pid, pstart]``."""
    if type(text) is not str:
        return False
    if not text:
        return True
    try:
        parts = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return (
        type(parts) is list
        and len(parts) == 4
        and all(type(p) is str for p in parts[:2])
        and all(type(p) is int for p in parts[2:])
    )


_HOLDER: Kind = ("a holder ('' or '[host, node, pid, pstart]')", _is_holder)
_VIA = one_of("inline", "queue")
_RECORD_FIELDS: Fields = {
    "limit": (COUNT, True),
    "cls": (TEXT, True),
    "slots": (("an object", lambda v: type(v) is dict), False),
    "parked": (("a list", lambda v: type(v) is list), True),
    "done": (("an object", lambda v: type(v) is dict), True),
}
_SLOT_FIELDS: Fields = {
    "st": (one_of("reserved", "promoted", "running"), False),
    "via": (_VIA, False),
    "h": (_HOLDER, False),
    "dl": (NUMBER, False),
    "ls": (NUMBER, False),
    "since": (NUMBER, False),
    "redo": (COUNT, False),
    "args": (TEXT, False),
    "p": (TEXT, False),
}
_ENTRY_FIELDS: Fields = {
    "token": (TEXT, False),
    "via": (_VIA, False),
    "h": (_HOLDER, False),
    "ls": (NUMBER, False),
    "since": (NUMBER, False),
    "args": (TEXT, False),
    "p": (TEXT, False),
    "dl": (NUMBER_OR_NULL, False),
}


def semaphore_problem(record: Record) -> str:
    """Return what is wrong with a concurrency record whose key was read; "" if every field is sound."""
    problem = fields_problem(record, "the record", _RECORD_FIELDS)
    if problem:
        return problem
    for token, slot in record["slots"].items():
        problem = fields_problem(slot, f"slot {shown(token)}", _SLOT_FIELDS)
        if problem:
            return problem
    for n, entry in enumerate(record.get("parked", ())):
        problem = fields_problem(entry, f"parked entry {n}", _ENTRY_FIELDS)
        if problem:
            return problem
        if entry["via"] == "inline" and entry["dl"] is None:
            return f"parked entry {n} waits inline with no deadline 'dl'"
    for token, expires in record.get("done", {}).items():
        if not NUMBER[1](expires):
            return f"the tombstone of {shown(token)} expires at {shown(expires)}, expected {NUMBER[0]}"
    return ""
