"""The semaphore scripts' replies read: each array by its fields' names, every record checked.

A record of the wrong shape (a field of the wrong type, not JSON, an unknown
status) is a :class:`Malformed` naming the structure it came from (an index
into ``_semaphores._PARTS``), which the store turns into a CorruptRecordError.
"""

from __future__ import annotations

import json
from collections import namedtuple
from collections.abc import Sequence
from typing import Any

from ...locks import Holder
from ..semaphores import Outcome, ParkedInfo, Promotion, SemaphoreState, SlotInfo, Via, decode_holder
from ._wire import text

__all__ = ["REPLIES", "Malformed"]

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
