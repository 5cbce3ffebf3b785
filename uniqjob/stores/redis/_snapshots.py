"""The lock store's snapshot replies read: the queue lock, run lock and clock, each field checked.

A script that finds a lock in the way replies with a snapshot (``_lua.SNAPSHOT``):
a mark, then JSON of the server's clock and each lock's fields and TTL. A
snapshot the client cannot parse at all is a BackendError (a reply mangled on
its way); a record with a field of the wrong shape is a CorruptRecordError
naming its Redis key: it stays in the store.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ...errors import BackendError, CorruptRecordError
from ...locks import QUEUED, RUNNING, Holder, Parts, QueueMeta, QueueRecord, RunRecord
from . import _lua as lua

__all__ = ["parts"]


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
    token, state, since, cls, cls_len, args, job_id = fields
    if state not in ("q", "r"):
        shown = "missing" if state is False else repr(state)[:40]
        raise _Shape(f"field s (state) is {shown}, not 'q' or 'r'")
    if cls_len is not False:
        length = _count(cls_len, "n (class length)")
        if length > len(key):
            raise _Shape(f"field n (class length) is {length}, longer than the key")
        cls = key[:length]
    return QueueRecord(
        _word(token, "t (token)"),
        RUNNING if state == "r" else QUEUED,
        _count(since, "a (since)") / 1_000_000,
        QueueMeta(_maybe(cls, "c (class)"), _maybe(args, "p (arguments)"), _maybe(job_id, "j (job id)")),
        ttl / 1000 if ttl >= 0 else None,
    )


def _run_record(fields: list[Any], ttl: int) -> RunRecord:
    """The run lock the snapshot's fields (_lua.RUN_FIELDS) describe; _Shape if they are damaged."""
    if type(fields) is not list or len(fields) != _RUN_COUNT:
        raise _Shape(f"fields are {fields!r:.60}, not the {_RUN_COUNT} the scripts read")
    token, host, node, pid, pstart, started, lease, fence = fields  # by name: _lua.RUN_FIELDS
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
