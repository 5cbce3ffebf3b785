"""Canonical encoding of job arguments and the lock keys made from it.

Pure functions, no I/O. The encoding is type-aware (``1``, ``"1"``, ``1.0`` and
``True`` differ), order-free for dicts and sets, and treats lists and tuples
alike, because queues serialise tuples as lists. Anything it does not know is a
:class:`~uniqjob.errors.UniqueKeyError` that names the argument's path: a
``repr()`` fallback would put memory addresses into keys and silently split them.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import json
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal, localcontext
from typing import Any

from .errors import UniqueKeyError

__all__ = ["KEY_VERSION", "KeyPlan", "canonical", "digest", "make_key"]

#: Bumped whenever the encoding changes, so old and new keys can never collide
#: silently; the version is part of every key.
KEY_VERSION = 1

_Encoder = Callable[[Any, str, bytearray], None]


def _str(value: str, out: bytearray) -> None:
    raw = value.encode("utf-8", "surrogatepass")
    out += b"s%d:" % len(raw)
    out += raw


def _enc_none(value: Any, path: str, out: bytearray) -> None:
    out += b"n"


def _enc_bool(value: bool, path: str, out: bytearray) -> None:
    out += b"T" if value else b"F"


def _enc_int(value: int, path: str, out: bytearray) -> None:
    out += b"i%d;" % value


def _enc_float(value: float, path: str, out: bytearray) -> None:
    if math.isnan(value):
        raise UniqueKeyError(path, "NaN is not equal to itself and cannot be part of a lock key")
    out += b"f" + (value + 0.0).hex().encode() + b";"  # + 0.0 folds -0.0 into 0.0


def _enc_str(value: str, path: str, out: bytearray) -> None:
    _str(value, out)


def _enc_bytes(value: bytes | bytearray | memoryview, path: str, out: bytearray) -> None:
    if isinstance(value, memoryview) and value.format not in ("B", "b", "c"):
        # A view of ints or floats equals only views of the same items, never bytes:
        # as raw bytes it would share a key with values it is not equal to.
        raise UniqueKeyError(
            path,
            f"a memoryview of {value.format!r} items cannot be part of a lock key; pass .tolist() or bytes",
        )
    raw = bytes(value)
    out += b"b%d:" % len(raw)
    out.extend(raw)


def _enc_seq(value: list[Any] | tuple[Any, ...], path: str, out: bytearray) -> None:
    out += b"l%d:" % len(value)
    for i, item in enumerate(value):
        _encode(item, f"{path}[{i}]", out)


def _enc_dict(value: Mapping[Any, Any], path: str, out: bytearray) -> None:
    pairs = []
    for k, v in value.items():
        item = bytearray()
        _encode(k, f"{path} key {_show(k)}", item)
        _encode(v, f"{path}[{_show(k)}]", item)
        pairs.append(bytes(item))
    pairs.sort()
    out += b"d%d:" % len(pairs)
    for pair in pairs:
        out += pair


def _enc_set(value: set[Any] | frozenset[Any], path: str, out: bytearray) -> None:
    items = []
    for v in value:
        encoded = bytearray()
        _encode(v, f"{path}{{{_show(v)}}}", encoded)
        items.append(bytes(encoded))
    items.sort()
    out += b"S%d:" % len(items)
    for item in items:
        out += item


def _enc_datetime(value: dt.datetime, path: str, out: bytearray) -> None:
    offset = value.utcoffset()
    if offset is None:
        out += b"Dn" + value.isoformat().encode()
    else:
        # One key per instant, whatever the zone it was written in.
        try:
            utc = (value.replace(tzinfo=None) - offset).isoformat()
        except OverflowError:
            raise UniqueKeyError(path, f"{value!r} is out of range once moved to UTC") from None
        out += b"Da" + utc.encode()
    out += b";"


def _enc_date(value: dt.date, path: str, out: bytearray) -> None:
    out += b"Y" + value.isoformat().encode() + b";"


def _enc_time(value: dt.time, path: str, out: bytearray) -> None:
    offset = value.utcoffset()
    if offset is None:
        out += b"H" + value.isoformat().encode() + b";"
        return
    # Aware times are equal, as Python compares them, when their time of day less
    # their offset (its whole seconds: Python ignores the rest) and microsecond are.
    seconds = value.hour * 3600 + value.minute * 60 + value.second - offset.days * 86400 - offset.seconds
    out += b"Ha%d.%06d;" % (seconds, value.microsecond)


def _enc_decimal(value: Decimal, path: str, out: bytearray) -> None:
    if value.is_nan():
        raise UniqueKeyError(path, "Decimal NaN is not equal to itself and cannot be part of a lock key")
    # Equal Decimals are one key: 1.5 and 1.50 normalise alike, and so do 0 and -0.
    # In a context of our own: the caller's precision would round (two unequal
    # values, one key) and its exponent letter would differ (one value, two keys).
    with localcontext(_DECIMAL_CONTEXT):
        text = "0" if value == 0 else str(value.normalize())
    out += b"M" + text.encode() + b";"


_DECIMAL_CONTEXT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN, capitals=1)


def _enc_uuid(value: uuid.UUID, path: str, out: bytearray) -> None:
    out += b"U" + value.hex.encode() + b";"


def _enc_enum(value: enum.Enum, path: str, out: bytearray) -> None:
    # A member differs from its value, even an IntEnum's: the class is in the key.
    cls = type(value)
    out += b"E"
    _str(f"{cls.__module__}.{cls.__qualname__}", out)
    _str(value.name, out)


_EXACT: dict[type, _Encoder] = {
    type(None): _enc_none,
    bool: _enc_bool,
    int: _enc_int,
    float: _enc_float,
    str: _enc_str,
    bytes: _enc_bytes,
    bytearray: _enc_bytes,
    memoryview: _enc_bytes,
    list: _enc_seq,
    tuple: _enc_seq,
    dict: _enc_dict,
    set: _enc_set,
    frozenset: _enc_set,
    dt.datetime: _enc_datetime,
    dt.date: _enc_date,
    dt.time: _enc_time,
    Decimal: _enc_decimal,
    uuid.UUID: _enc_uuid,
}

# Order matters: Enum before the types its members may also be (IntEnum is an
# int), bool before int, datetime before date.
_BY_ISINSTANCE: tuple[tuple[type | tuple[type, ...], _Encoder], ...] = (
    (enum.Enum, _enc_enum),
    (bool, _enc_bool),
    (int, _enc_int),
    (float, _enc_float),
    (str, _enc_str),
    ((bytes, bytearray), _enc_bytes),
    ((list, tuple), _enc_seq),
    (Mapping, _enc_dict),
    ((set, frozenset), _enc_set),
    (dt.datetime, _enc_datetime),
    (dt.date, _enc_date),
    (dt.time, _enc_time),
    (Decimal, _enc_decimal),
    (uuid.UUID, _enc_uuid),
)


def _show(value: Any) -> str:
    """Name a dict key or set item in an error path, never with a memory address."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if type(value) in (int, bool, float, type(None)):
        return repr(value)
    return f"<{type(value).__qualname__}>"


def _encode(value: Any, path: str, out: bytearray) -> None:
    encoder = _EXACT.get(type(value))
    if encoder is None:
        for types, candidate in _BY_ISINSTANCE:
            if isinstance(value, types):
                encoder = candidate
                break
        else:
            raise UniqueKeyError(
                path,
                f"values of type {type(value).__module__}.{type(value).__qualname__} cannot be "
                "part of a lock key (supported: None, bool, int, float, str, bytes, list, tuple, "
                "dict, set, datetime, date, time, Decimal, UUID, Enum); "
                "set unique_args or define unique_key()",
            )
    encoder(value, path, out)


def canonical(value: Any, path: str = "") -> bytes:
    """Return the canonical encoding of ``value``; equal values encode alike."""
    out = bytearray()
    _encode(value, path, out)
    return bytes(out)


def digest(value: Any, path: str = "") -> str:
    """Return the versioned hex digest of ``value``'s canonical encoding."""
    return hashlib.blake2b(canonical(value, path), digest_size=16).hexdigest()


# Parameter names come from job signatures, so there are few sets of them: a
# plan is kept per set (a bounded number, in case a caller passes made-up names).
_plans: dict[tuple[str, ...], KeyPlan] = {}


def make_key(name: str, arguments: Mapping[str, Any]) -> str:
    """Return the lock key of job ``name`` called with bound ``arguments``.

    Each argument's path in an error is its parameter name.
    """
    names = tuple(arguments)
    plan = _plans.get(names)
    if plan is None:
        plan = KeyPlan(names)
        if len(_plans) < 4096:
            _plans[names] = plan
    return plan.key(name, list(arguments.values()))


class KeyPlan:
    """The encoding behind :func:`make_key`, for one fixed list of parameter names, planned once.

    ``key(name, values)`` takes the values in the order of ``names`` (a bound
    call's, defaults applied) and returns ``make_key(name, dict(zip(names,
    values)))``: the sort and the names' encodings are done here, once per
    job class (or set of names), instead of on every enqueue.
    """

    __slots__ = ("_order", "_prefix", "defaults", "required", "size")

    def __init__(self, names: Sequence[str], defaults: Sequence[Any] = ()) -> None:
        if len(set(names)) != len(names):
            raise ValueError(f"parameter names repeat: {names!r}")
        if len(defaults) > len(names):
            raise ValueError(f"more defaults than parameters: {defaults!r}")
        self.size = len(names)
        #: How many leading values a call must give; the rest default to ``defaults``.
        self.required = len(names) - len(defaults)
        #: One entry per parameter, so ``args + defaults[len(args):]`` is a whole positional call.
        self.defaults: tuple[Any, ...] = (None,) * self.required + tuple(defaults)
        self._prefix = b"d%d:" % len(names)
        heads = []
        for i in sorted(range(len(names)), key=names.__getitem__):
            head = bytearray()
            _str(names[i], head)
            heads.append((i, bytes(head), names[i]))
        self._order = tuple(heads)

    def key(self, name: str, values: Sequence[Any]) -> str:
        """Return the lock key of job ``name`` called with ``values`` (one per name, in order)."""
        # Every enqueue makes a key: ints and strs, the usual arguments, skip the
        # dispatch (the bytes are the same as _enc_int's and _enc_str's).
        out = bytearray(self._prefix)
        for i, head, param in self._order:
            out += head
            value = values[i]
            kind = type(value)
            if kind is int:
                out += b"i%d;" % value
            elif kind is str:
                _str(value, out)
            else:
                _encode(value, param, out)
        return f"{name}:{KEY_VERSION}:{hashlib.blake2b(out, digest_size=16).hexdigest()}"
