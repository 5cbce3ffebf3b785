"""The scripts' replies read, every record checked: the lock store's snapshots, the semaphore store's arrays.

A lock script that finds a lock in the way replies with a snapshot (``_lua.SNAPSHOT``):
a mark, then JSON of the server's clock and each lock's fields and TTL. A
snapshot the client cannot parse at all is a BackendError (a reply mangled on
its way); a record with a field of the wrong shape is a CorruptRecordError
naming its Redis key: it stays in the store.

A semaphore script answers with an array, read by its fields' names. A record
of the wrong shape (a field of the wrong type, not JSON, an unknown status) is
a :class:`Malformed` naming the structure it came from (an index into
``_semaphores._PARTS``), which the store turns into a CorruptRecordError.
"""

from __future__ import annotations

import json
from collections import namedtuple
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import BackendError, CorruptRecordError
from ...locks import (
    QUEUED,
    RUNNING,
    Coalesced,
    Holder,
    LockState,
    Parts,
    PendingCall,
    QueueMeta,
    QueueRecord,
    RunRecord,
)
from ..semaphores import Outcome, ParkedInfo, Promotion, SemaphoreState, SlotInfo, Via, decode_holder
from . import _lua as lua
from ._wire import text

__all__ = ["COALESCED", "REPLIES", "Malformed", "latest", "parts", "pending_call"]

# -- the lock store's snapshots ---------------------------------------------------------

# The C scanner itself: JSONDecoder.decode adds two Python calls and a regex for whitespace.
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


class _Shape(ValueError):
    """A field of a record that is not what the scripts write: why, for CorruptRecordError."""


def _word(value: object, field: str) -> str:
    """A field that must be set: a non-empty string."""
    if type(value) is str and value:
        return value
    raise _Shape(f"field {field} is {'missing' if value is False else repr(value)}, not a non-empty string")


def _string(value: object, field: str) -> str:
    """A field that must be set, and may be empty."""
    if type(value) is str:
        return value
    raise _Shape(f"field {field} is {'missing' if value is False else repr(value)[:40]}, not a string")


def _maybe(value: object, field: str) -> str:
    """A field that may be missing (false in a snapshot): a string, or ""."""
    if value is False:
        return ""
    if type(value) is str:
        return value
    raise _Shape(f"field {field} is {value!r}, not a string")


def _count(value: object, field: str) -> int:
    """A field that must hold a whole number >= 0, written in ASCII digits."""
    if type(value) is str and value.isdigit() and value.isascii() and len(value) <= 20:
        return int(value)
    raise _Shape(f"field {field} is {'missing' if value is False else repr(value)[:40]}, not a whole number")


# How many fields a snapshot holds of each lock (the scripts read _lua.QUEUE_FIELDS / RUN_FIELDS).
_QUEUE_COUNT = len(lua.QUEUE_FIELDS)
_RUN_COUNT = len(lua.RUN_FIELDS)


def _queue_record(key: str, fields: list[Any], ttl: int) -> QueueRecord:
    """The queue lock the snapshot's fields (_lua.QUEUE_FIELDS) describe; _Shape if they are damaged."""
    if type(fields) is not list or len(fields) != _QUEUE_COUNT:
        raise _Shape(f"fields are {fields!r:.60}, not the {_QUEUE_COUNT} the scripts read")
    # by name: the names and order of _lua.QUEUE_FIELDS (a test holds them to it); an unpack
    # is the quickest way to name a list's items
    token, state, since, cls, cls_len, args, job_id, call, p_token, p_args, p_job_id, p_call, due = fields
    if state not in ("q", "r"):
        shown = "missing" if state is False else repr(state)[:40]
        raise _Shape(f"field s (state) is {shown}, not 'q' or 'r'")
    if cls_len is not False:
        length = _count(cls_len, "n (class length)")
        if length > len(key):
            raise _Shape(f"field n (class length) is {length}, longer than the key")
        cls = key[:length]
    meta = QueueMeta(
        _maybe(cls, "c (class)"),
        _maybe(args, "p (arguments)"),
        _maybe(job_id, "j (job id)"),
        _maybe(call, "k (call)"),
    )
    pending = None
    if p_token is not False:  # a call waiting behind this one (keep_last)
        p_meta = QueueMeta("", _maybe(p_args, "A"), _maybe(p_job_id, "J"), _maybe(p_call, "K"))
        pending = PendingCall(_word(p_token, "P (pending token)"), p_meta)
    return QueueRecord(
        _word(token, "t (token)"),
        RUNNING if state == "r" else QUEUED,
        _count(since, "a (since)") / 1_000_000,
        meta,
        ttl / 1000 if ttl >= 0 else None,
        pending,
        None if due is False else _count(due, "d (due)") / 1_000_000,
    )


def _run_record(fields: list[Any], ttl: int) -> RunRecord:
    """The run lock the snapshot's fields (_lua.RUN_FIELDS) describe; _Shape if they are damaged."""
    if type(fields) is not list or len(fields) != _RUN_COUNT:
        raise _Shape(f"fields are {fields!r:.60}, not the {_RUN_COUNT} the scripts read")
    token, host, node, pid, pstart, started, lease, fence, stop = fields  # by name: _lua.RUN_FIELDS
    return RunRecord(
        _word(token, "t (token)"),
        Holder(
            _string(host, "h (host)"),
            _string(node, "o (node)"),
            _count(pid, "i (pid)"),
            _count(pstart, "b (process start)"),
        ),
        _count(started, "a (started)") / 1_000_000,
        _count(lease, "l (lease)") / 1000,
        max(ttl, 0) / 1000,
        0 if fence is False else _count(fence, "f (fence)"),  # a lock taken before fences: none
        _maybe(stop, "k (stop asked by)"),
    )


def parts(key: str, reply: str, names: list[str], store: str) -> Parts:
    """The queue lock, run lock and clock the snapshot ``reply`` of ``key`` holds, each field checked.

    ``names``: the key's Redis names (queue lock, run lock, ...), for a CorruptRecordError;
    ``store``: the store's name, for the errors.
    """
    try:
        if reply[:1] not in ("Q", "S"):
            raise ValueError("no mark")
        now, queue, queue_ttl, run, run_ttl = _scan_json(reply, 1)[0]  # by name: _lua.SNAPSHOT
        clock = int(now) / 1_000_000
        if type(queue_ttl) is not int or type(run_ttl) is not int:
            raise ValueError("ttl")
    except (StopIteration, ValueError, TypeError) as exc:  # StopIteration: the scanner's "not JSON"
        raise BackendError(f"unreadable lock state from the server: {reply[:80]!r}", store) from exc
    # A lock that is not there comes as false; each that is, is checked field by field.
    queue_lock = run_lock = None
    index = 0
    try:
        if queue is not False:
            queue_lock = _queue_record(key, queue, queue_ttl)
        index = 1
        if run is not False:
            run_lock = _run_record(run, run_ttl)
    except _Shape as exc:
        raise CorruptRecordError(names[index], str(exc), key=key, backend=store) from None
    return queue_lock, run_lock, clock


#: CLAIM's reply letter before a snapshot: what it coalesced (LockState.coalesced).
COALESCED: dict[str, Coalesced] = {"L": "latest", "P": "pending", "R": "replaced"}


def latest(key: str, meta: QueueMeta, reply: str, store: str) -> LockState:
    """CLAIM's short reply for a call coalesced into a queued lock with no run lock (see _lua.CLAIM):
    that lock as the call left it (its arguments now ``meta``'s), read without a snapshot."""
    try:
        _, now, since, pttl, due, token, job_id = reply.split(" ", 6)
        ttl = int(pttl)
        queue = QueueRecord(
            token, QUEUED, int(since) / 1_000_000, QueueMeta(meta.cls, meta.args, job_id, meta.call),
            None if ttl < 0 else ttl / 1000, None, int(due) / 1_000_000 if due else None,
        )  # fmt: skip
        state = LockState(key, queue, None, int(now) / 1_000_000)
    except ValueError as exc:
        raise BackendError(f"unreadable lock state from the server: {reply[:80]!r}", store) from exc
    state.coalesced = "latest"
    return state


def pending_call(reply: Any) -> PendingCall | None:
    """FINISH's reply: the pending call it queued ({token, args, job id, call}), else None."""
    if type(reply) is not list:
        return None
    token, args, job_id, call = (text(part) for part in reply)
    return PendingCall(token, QueueMeta("", args, job_id, call))  # its class is the key's


# -- the semaphore store's arrays -------------------------------------------------------

_STATES = frozenset({"reserved", "promoted", "running"})
_VIAS = frozenset({"queue", "inline"})
_NUMBER = (int, float)


class Malformed(Exception):
    """A record read back from Redis has the wrong shape; turned into a CorruptRecordError naming it."""

    def __init__(self, part: int, reason: str) -> None:
        super().__init__(reason)
        self.part = part  # index into _PARTS
        self.reason = reason


# The scripts' replies, by name: each is the array its script's head in _semaphore_lua states
# ("Returns {...}", and "a promotion is {...}"), field for field (tests/test_redis_semaphores.py
# holds the two in step).
Promoted = namedtuple("Promoted", "token via payload redo")
Acquired = namedtuple("Acquired", "status promotions position slots now_ms")
Started = namedtuple("Started", "status promotions position busy")
Settled = namedtuple("Settled", "status promotions")
Counted = namedtuple("Counted", "count promotions")
Read = namedtuple("Read", "now_ms meta slots parked head entries")

#: The reply of each script that answers with an array, read by these names.
REPLIES: dict[str, type[tuple[Any, ...]]] = {
    "ACQUIRE": Acquired, "START": Started, "RENEW": Settled, "RELEASE": Settled,
    "REQUEUE": Settled, "REAP": Counted, "DROP": Counted, "READ": Read,
}  # fmt: skip


def _promotions(flat: Sequence[Any]) -> tuple[Promotion, ...]:
    out = []
    for p in map(Promoted._make, flat):
        via: Via = "inline" if text(p.via) == "inline" else "queue"
        out.append(Promotion(text(p.token), via, text(p.payload), int(p.redo)))
    return tuple(out)


def settled(raw: Any) -> Outcome:
    reply = Settled._make(raw)
    return Outcome(text(reply.status), _promotions(reply.promotions))  # type: ignore[arg-type]


def counted(raw: Any) -> Outcome:
    reply = Counted._make(raw)
    return Outcome("ok", _promotions(reply.promotions), count=int(reply.count))


def acquired(raw: Any) -> Outcome:
    reply = Acquired._make(raw)
    return Outcome(
        text(reply.status),  # type: ignore[arg-type]
        _promotions(reply.promotions),
        position=int(reply.position),
        slots=slots(reply.slots, int(reply.now_ms)),
    )


def started(token: str, raw: Any) -> Outcome:
    reply = Started._make(raw)
    return Outcome(
        text(reply.status),  # type: ignore[arg-type]
        _promotions(reply.promotions),
        position=int(reply.position),
        holder=_holder(0, f"slot {token}", text(reply.busy)),
    )


def withdrawn(raw: Any) -> Outcome:
    return Outcome(text(raw))  # type: ignore[arg-type]


def pairs(flat: Sequence[Any]) -> list[tuple[str, str]]:
    return [(text(flat[i]), text(flat[i + 1])) for i in range(0, len(flat), 2)]


def _record(part: int, what: str, raw: Any, texts: Sequence[str], numbers: Sequence[str]) -> dict[str, Any]:
    """Parse one JSON record of ``_PARTS[part]``, checking that its fields have their types."""
    try:
        data = json.loads(text(raw))
    except ValueError:
        raise Malformed(part, f"{what} is not JSON") from None
    if not isinstance(data, dict):
        raise Malformed(part, f"{what} is not a JSON object")
    for name in texts:
        if not isinstance(data.get(name), str):
            raise Malformed(part, f"{what}: field {name} is missing or not text")
    for name in numbers:
        value = data.get(name)
        if not isinstance(value, _NUMBER) or isinstance(value, bool):
            raise Malformed(part, f"{what}: field {name} is missing or not a number")
    if data.get("via") not in _VIAS:
        raise Malformed(part, f"{what}: unknown via {data.get('via')!r}")
    return data


def _holder(part: int, what: str, text: str) -> Holder | None:
    try:
        return decode_holder(text)
    except (ValueError, TypeError):
        raise Malformed(part, f"{what}: holder {text!r} is not a holder") from None


def slots(flat: Sequence[Any], now_ms: int) -> tuple[SlotInfo, ...]:
    out = []
    for i in range(0, len(flat), 2):
        token = text(flat[i])
        what = f"slot {token}"
        s = _record(0, what, flat[i + 1], ("st", "via", "h", "args"), ("dl", "ls", "since", "redo"))
        if s["st"] not in _STATES:
            raise Malformed(0, f"{what}: unknown status {s['st']!r}")
        if s["redo"] != int(s["redo"]):
            raise Malformed(0, f"{what}: field redo is not whole")
        out.append(
            SlotInfo(
                token=token,
                status=s["st"],
                via=s["via"],
                holder=_holder(0, what, s["h"]),
                since=s["since"] / 1000,
                lease=s["ls"] / 1000,
                lease_left=(s["dl"] - now_ms) / 1000,
                redo=int(s["redo"]),
                args=s["args"],
            )
        )
    return tuple(out)


def parked(token: str, raw: Any) -> ParkedInfo:
    what = f"parked call {token}"
    e = _record(2, what, raw, ("via", "h", "args"), ("since",))
    return ParkedInfo(token, e["via"], _holder(2, what, e["h"]), e["since"] / 1000, e["args"])


def state(key: str, raw: Any) -> SemaphoreState:
    """The state of ``key`` a READ reply describes, each record checked."""
    reply = Read._make(raw)
    flat = reply.meta
    meta = {text(flat[i]): text(flat[i + 1]) for i in range(0, len(flat), 2)}
    limit = meta.get("limit", "1")
    if not limit.isdigit():
        raise Malformed(4, f"field limit is {limit!r}, not a whole number")
    head = [parked(text(token), raw) for token, raw in zip(reply.head, reply.entries, strict=True) if raw]
    return SemaphoreState(
        key=key,
        limit=int(limit),
        job_class=meta.get("cls", ""),
        slots=slots(reply.slots, int(reply.now_ms)),
        parked=int(reply.parked),
        head=tuple(head),
        now=int(reply.now_ms) / 1000,
    )
