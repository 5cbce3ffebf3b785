"""Canonical encoding of job arguments and the lock keys made from it.

Pure functions, no I/O. The encoding is type-aware (``1``, ``"1"``, ``1.0`` and
``True`` differ), order-free for dicts and sets, and treats lists and tuples
alike, because queues serialise tuples as lists. Anything it does not know is a
:class:`~uniqjob.errors.UniqueKeyError` that names the argument's path: a
``repr()`` fallback would put memory addresses into keys and silently split them.

Every value of a supported type is keyed, however large (an ``int`` of a
million digits too, without Python's limit on int-to-text conversion), and two
kinds of value are refused by name rather than crashing the interpreter: a
container that contains itself (a cycle), and nesting deeper than
:data:`MAX_DEPTH` levels of lists, tuples, dicts and sets.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from .errors import UniqueKeyError

if TYPE_CHECKING:
    import datetime as dt
    import decimal
    import uuid

__all__ = ["KEY_VERSION", "MAX_DEPTH", "KeyPlan", "canonical", "digest", "make_key"]

#: Bumped whenever the encoding changes, so old and new keys can never collide
#: silently; the version is part of every key.
KEY_VERSION = 1

#: How many containers (lists, tuples, dicts, sets) deep an argument may nest:
#: a value nested deeper is refused with :class:`UniqueKeyError` naming it,
#: checked before recursing, so even a list nested 100,000 deep fails at once.
MAX_DEPTH = 100

#: The containers being encoded, outermost first, by ``id()``: each maps to its
#: path, to name the one a cycle comes back to. Its length is the depth.
_Open = dict[int, str]

_Encoder = Callable[[Any, str, bytearray, _Open], None]


def _str(value: str, out: bytearray) -> None:
    raw = value.encode("utf-8", "surrogatepass")
    out += b"s%d:" % len(raw)
    out += raw


def _enc_none(value: Any, path: str, out: bytearray, open_: _Open) -> None:
    out += b"n"


def _enc_bool(value: bool, path: str, out: bytearray, open_: _Open) -> None:
    out += b"T" if value else b"F"


def _enc_int(value: int, path: str, out: bytearray, open_: _Open) -> None:
    try:
        out += b"i%d;" % value
    except ValueError:  # beyond this process's int-to-text limit (sys.set_int_max_str_digits)
        _big_int(int(value), out)


#: Ints below this in magnitude (up to 4300 digits, Python's default limit on
#: converting an int to text) are keyed in decimal, as they always were; larger
#: ones in hexadecimal, which takes linear time. Which form an int gets depends
#: on its value alone, so equal ints still share one key.
_DECIMAL_BOUND = 10**4300
_CHUNK_DIGITS = 600  # below the lowest limit a process may set (640 digits)
_CHUNK = 10**_CHUNK_DIGITS


def _big_int(value: int, out: bytearray) -> None:
    """Encode an int too long for ``%d`` here, never through the int-to-text limit."""
    magnitude = -value if value < 0 else value
    if magnitude >= _DECIMAL_BOUND:
        out += b"I" + (b"-" if value < 0 else b"") + format(magnitude, "x").encode() + b";"
        return
    # Within the default limit but past a lowered one: the same decimal digits, in chunks.
    chunks = []
    while magnitude >= _CHUNK:
        magnitude, low = divmod(magnitude, _CHUNK)
        chunks.append(b"%0*d" % (_CHUNK_DIGITS, low))
    chunks.append(b"%d" % magnitude)
    out += b"i" + (b"-" if value < 0 else b"") + b"".join(reversed(chunks)) + b";"


def _enc_float(value: float, path: str, out: bytearray, open_: _Open) -> None:
    if math.isnan(value):
        raise UniqueKeyError(path, "NaN is not equal to itself and cannot be part of a lock key")
    out += b"f" + (value + 0.0).hex().encode() + b";"  # + 0.0 folds -0.0 into 0.0


def _enc_str(value: str, path: str, out: bytearray, open_: _Open) -> None:
    _str(value, out)


def _enc_bytes(value: bytes | bytearray | memoryview, path: str, out: bytearray, open_: _Open) -> None:
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


def _enter(value: Any, path: str, open_: _Open) -> None:
    """Open container ``value`` at ``path``, refusing a cycle and nesting past :data:`MAX_DEPTH`."""
    outer = open_.get(id(value))
    if outer is not None:
        raise UniqueKeyError(
            path,
            f"this {type(value).__qualname__} contains itself (it is {outer or 'the argument'} again): "
            "a value with a cycle cannot be part of a lock key",
        )
    if len(open_) >= MAX_DEPTH:
        raise UniqueKeyError(
            path, f"nests deeper than {MAX_DEPTH} containers, the most a lock key's arguments may nest"
        )
    open_[id(value)] = path


def _enc_seq(value: list[Any] | tuple[Any, ...], path: str, out: bytearray, open_: _Open) -> None:
    _enter(value, path, open_)
    out += b"l%d:" % len(value)
    for i, item in enumerate(value):
        _encode(item, f"{path}[{i}]", out, open_)
    del open_[id(value)]


def _enc_dict(value: Mapping[Any, Any], path: str, out: bytearray, open_: _Open) -> None:
    _enter(value, path, open_)
    pairs = []
    for k, v in value.items():
        item = bytearray()
        _encode(k, f"{path} key {_show(k)}", item, open_)
        _encode(v, f"{path}[{_show(k)}]", item, open_)
        pairs.append(bytes(item))
    del open_[id(value)]
    pairs.sort()
    out += b"d%d:" % len(pairs)
    for pair in pairs:
        out += pair


def _enc_set(value: set[Any] | frozenset[Any], path: str, out: bytearray, open_: _Open) -> None:
    _enter(value, path, open_)
    items = []
    for v in value:
        encoded = bytearray()
        _encode(v, f"{path}{{{_show(v)}}}", encoded, open_)
        items.append(bytes(encoded))
    del open_[id(value)]
    items.sort()
    out += b"S%d:" % len(items)
    for item in items:
        out += item


def _enc_datetime(value: dt.datetime, path: str, out: bytearray, open_: _Open) -> None:
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


def _enc_date(value: dt.date, path: str, out: bytearray, open_: _Open) -> None:
    out += b"Y" + value.isoformat().encode() + b";"


def _enc_time(value: dt.time, path: str, out: bytearray, open_: _Open) -> None:
    offset = value.utcoffset()
    if offset is None:
        out += b"H" + value.isoformat().encode() + b";"
        return
    # Aware times are equal, as Python compares them, when their time of day less
    # their offset (its whole seconds: Python ignores the rest) and microsecond are.
    seconds = value.hour * 3600 + value.minute * 60 + value.second - offset.days * 86400 - offset.seconds
    out += b"Ha%d.%06d;" % (seconds, value.microsecond)


def _enc_timedelta(value: dt.timedelta, path: str, out: bytearray, open_: _Open) -> None:
    # Equal timedeltas have equal normalised parts: one exact count of microseconds.
    out += b"t%d;" % ((value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds)


def _enc_decimal(value: decimal.Decimal, path: str, out: bytearray, open_: _Open) -> None:
    if value.is_nan():
        raise UniqueKeyError(path, "Decimal NaN is not equal to itself and cannot be part of a lock key")
    # Equal Decimals are one key: 1.5 and 1.50 normalise alike, and so do 0 and -0.
    # In a context of our own: the caller's precision would round (two unequal
    # values, one key) and its exponent letter would differ (one value, two keys).
    import decimal  # loaded already: ``value`` is a Decimal

    with decimal.localcontext(_decimal_context()):
        text = "0" if value == 0 else str(value.normalize())
    out += b"M" + text.encode() + b";"


@cache
def _decimal_context() -> decimal.Context:
    import decimal

    return decimal.Context(prec=decimal.MAX_PREC, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN, capitals=1)


def _enc_uuid(value: uuid.UUID, path: str, out: bytearray, open_: _Open) -> None:
    out += b"U" + value.hex.encode() + b";"


def _enc_enum(value: enum.Enum, path: str, out: bytearray, open_: _Open) -> None:
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
}  # and the types of _LATE, once seen

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
    # then _LATE's, in order
)

#: The types of modules not imported here, in order (datetime before date): (module, type, encoder).
_LATE: tuple[tuple[str, str, _Encoder], ...] = (
    ("datetime", "datetime", _enc_datetime),
    ("datetime", "date", _enc_date),
    ("datetime", "time", _enc_time),
    ("datetime", "timedelta", _enc_timedelta),
    ("decimal", "Decimal", _enc_decimal),
    ("uuid", "UUID", _enc_uuid),
)


def _late(value: Any) -> _Encoder | None:
    """The encoder of a value of one of :data:`_LATE`'s types, else None.

    Their modules are not imported here (a process whose keys hold none of them
    never loads them): a value of one exists only once its module is loaded.
    """
    for module, name, encoder in _LATE:
        loaded = sys.modules.get(module)
        if loaded is not None:
            cls = getattr(loaded, name)
            if isinstance(value, cls):
                _EXACT.setdefault(cls, encoder)  # the exact type, from now on, at once
                return encoder
    return None


def _show(value: Any) -> str:
    """Name a dict key or set item in an error path, never with a memory address."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if type(value) in (int, bool, float, type(None)):
        try:
            return repr(value)
        except ValueError:  # an int past the int-to-text limit
            return f"<int of {value.bit_length()} bits>"
    return f"<{type(value).__qualname__}>"


def _encode(value: Any, path: str, out: bytearray, open_: _Open) -> None:
    encoder = _EXACT.get(type(value))
    if encoder is None:
        for types, candidate in _BY_ISINSTANCE:
            if isinstance(value, types):
                encoder = candidate
                break
        else:
            encoder = _late(value)
        if encoder is None:
            raise UniqueKeyError(
                path,
                f"values of type {type(value).__module__}.{type(value).__qualname__} cannot be "
                "part of a lock key (supported: None, bool, int, float, str, bytes, list, tuple, "
                "dict, set, datetime, date, time, timedelta, Decimal, UUID, Enum); "
                "set unique_args or define unique_key()",
            )
    encoder(value, path, out, open_)


def canonical(value: Any, path: str = "") -> bytes:
    """Return the canonical encoding of ``value``; equal values encode alike."""
    out = bytearray()
    _encode(value, path, out, {})
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
                try:
                    out += b"i%d;" % value
                except ValueError:  # past the int-to-text limit: _enc_int's bytes, the slow way
                    _big_int(value, out)
            elif kind is str:
                _str(value, out)
            else:
                _encode(value, param, out, {})
        return f"{name}:{KEY_VERSION}:{hashlib.blake2b(out, digest_size=16).hexdigest()}"
