"""A parked call stored as data: the job class's import path and its arguments in typed JSON.

Any process may promote a parked job, so the call must survive the trip
through the store exactly: ``(1,)`` comes back a tuple, ``b"x"`` bytes, an
aware datetime with its zone. The form is JSON (never pickle: a store shared
by many hosts must not be a way to run code), and every value that JSON cannot
carry as itself is an object ``{"$": tag, "v": ...}``. A value of any other
type is an :class:`~uniqjob.errors.UnstorableCallError` naming its path, raised
at enqueue rather than when the job is promoted hours later.
"""

from __future__ import annotations

import base64
import datetime as dt
import enum
import json
import math
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from importlib import import_module
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from ..errors import UnstorableCallError

if TYPE_CHECKING:
    from ..job import UniqueJob

__all__ = ["FORMAT", "StoredCall", "class_path", "decode_call", "decode_value", "encode_call", "encode_value"]

#: Bumped if the stored form changes; a newer form is refused by name, never misread.
FORMAT = 1

_SUPPORTED = (
    "None, bool, int, float, str, bytes, bytearray, list, tuple, dict, set, frozenset, "
    "datetime, date, time, timedelta, Decimal, UUID, Enum"
)


def _tagged(tag: str, value: Any) -> dict[str, Any]:
    return {"$": tag, "v": value}


def _float(value: float, path: str) -> Any:
    if math.isfinite(value):
        return value
    return _tagged("float", "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))


def _zone(value: dt.tzinfo | None, path: str) -> str | None:
    """Name a datetime's zone so it comes back the same; a fixed offset lives in the ISO text."""
    if value is None or isinstance(value, dt.timezone):
        return None
    if isinstance(value, ZoneInfo):
        return value.key
    raise UnstorableCallError(
        path, f"time zone of type {type(value).__qualname__} cannot be stored; use zoneinfo.ZoneInfo"
    )


def _datetime(value: dt.datetime, path: str) -> Any:
    zone = _zone(value.tzinfo, path)
    if zone is None:
        return _tagged("datetime", [value.isoformat()])
    # The wall time, zone and fold, not the instant: exactly the same object comes back.
    return _tagged("datetime", [value.replace(tzinfo=None).isoformat(), zone, value.fold])


def _seq(value: Any, path: str) -> list[Any]:
    return [encode_value(item, f"{path}[{i}]") for i, item in enumerate(value)]


def _dict(value: dict[Any, Any], path: str) -> Any:
    pairs = [
        [encode_value(k, f"{path} key {k!r}"), encode_value(v, f"{path}[{k!r}]")]
        for k, v in value.items()
    ]
    return _tagged("dict", pairs)


_Encoder = Callable[[Any, str], Any]

# Exact types only: a str or dict subclass would come back as its base type, which is not "reversible".
_ENCODERS: dict[type, _Encoder] = {
    type(None): lambda v, p: v,
    bool: lambda v, p: v,
    int: lambda v, p: v,
    str: lambda v, p: v,
    float: _float,
    list: _seq,
    tuple: lambda v, p: _tagged("tuple", _seq(v, p)),
    dict: _dict,
    set: lambda v, p: _tagged("set", _seq(v, p)),
    frozenset: lambda v, p: _tagged("frozenset", _seq(v, p)),
    bytes: lambda v, p: _tagged("bytes", base64.b64encode(v).decode("ascii")),
    bytearray: lambda v, p: _tagged("bytearray", base64.b64encode(v).decode("ascii")),
    dt.datetime: _datetime,
    dt.date: lambda v, p: _tagged("date", v.isoformat()),
    dt.time: lambda v, p: _tagged("time", [v.isoformat(), _zone(v.tzinfo, p)]),
    dt.timedelta: lambda v, p: _tagged("timedelta", [v.days, v.seconds, v.microseconds]),
    Decimal: lambda v, p: _tagged("decimal", str(v)),
    uuid.UUID: lambda v, p: _tagged("uuid", str(v)),
}


def encode_value(value: Any, path: str = "") -> Any:
    """Return ``value`` as a JSON-ready structure that :func:`decode_value` turns back into an equal value."""
    encoder = _ENCODERS.get(type(value))
    if encoder is not None:
        return encoder(value, path)
    if isinstance(value, enum.Enum):
        return _tagged("enum", [class_path(type(value), path), value.name])
    raise UnstorableCallError(
        path,
        f"values of type {type(value).__module__}.{type(value).__qualname__} cannot be stored with a "
        f"parked job (supported: {_SUPPORTED}); pass an id and load the object in perform()",
    )


def _resolve(path: str) -> Any:
    module, _, qualname = path.partition(":")
    obj: Any = import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def class_path(cls: type, path: str = "") -> str:
    """Return ``module:QualName`` for ``cls``, checking that another process can import it by that name."""
    where = f"{cls.__module__}.{cls.__qualname__}"
    if "<locals>" in cls.__qualname__:
        raise UnstorableCallError(
            path, f"{where} is defined inside a function; another process cannot import it"
        )
    if cls.__module__ == "__main__":
        raise UnstorableCallError(
            path, f"{where} is defined in __main__; move it to a module that workers can import"
        )
    text = f"{cls.__module__}:{cls.__qualname__}"
    try:
        found = _resolve(text)
    except (ImportError, AttributeError) as exc:
        raise UnstorableCallError(path, f"{where} cannot be imported by its name: {exc}") from None
    if found is not cls:
        raise UnstorableCallError(path, f"{where} is not the object found at that import path")
    return text


def _bad(path: str, reason: str) -> UnstorableCallError:
    return UnstorableCallError(path, f"stored call is damaged: {reason}")


def decode_value(data: Any, path: str = "") -> Any:
    """Return the value that :func:`encode_value` stored as ``data``."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode_value(item, f"{path}[{i}]") for i, item in enumerate(data)]
    if not isinstance(data, dict) or set(data) != {"$", "v"}:
        raise _bad(path, f"unexpected {type(data).__name__}")
    tag, v = data["$"], data["v"]
    try:
        return _DECODERS[tag](v, path)
    except KeyError:
        raise _bad(path, f"unknown tag {tag!r}") from None
    except (TypeError, ValueError, LookupError, ArithmeticError) as exc:
        raise _bad(path, f"bad {tag!r} value: {exc}") from None


def _decode_datetime(v: list[Any], path: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(v[0])
    return value.replace(tzinfo=ZoneInfo(v[1]), fold=v[2]) if len(v) > 1 else value


def _decode_time(v: list[Any], path: str) -> dt.time:
    value = dt.time.fromisoformat(v[0])
    return value.replace(tzinfo=ZoneInfo(v[1])) if v[1] else value


def _decode_enum(v: list[str], path: str) -> enum.Enum:
    try:
        cls = _resolve(v[0])
    except (ImportError, AttributeError) as exc:
        raise _bad(path, f"enum {v[0]} cannot be imported: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
        raise _bad(path, f"{v[0]} is not an Enum")
    return cls[v[1]]


_DECODERS: dict[str, Callable[[Any, str], Any]] = {
    "float": lambda v, p: float(v),
    "tuple": lambda v, p: tuple(decode_value(v, p)),
    "set": lambda v, p: set(decode_value(v, p)),
    "frozenset": lambda v, p: frozenset(decode_value(v, p)),
    "dict": lambda v, p: {decode_value(k, p): decode_value(x, p) for k, x in v},
    "bytes": lambda v, p: base64.b64decode(v, validate=True),
    "bytearray": lambda v, p: bytearray(base64.b64decode(v, validate=True)),
    "datetime": _decode_datetime,
    "date": lambda v, p: dt.date.fromisoformat(v),
    "time": _decode_time,
    "timedelta": lambda v, p: dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2]),
    "decimal": lambda v, p: Decimal(v),
    "uuid": lambda v, p: uuid.UUID(v),
    "enum": _decode_enum,
}


@dataclass(frozen=True, slots=True)
class StoredCall:
    """A parked call read back: the job class, its arguments, and the uniqueness lock key it holds."""

    job_class: type[UniqueJob]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    lock_key: str


def encode_call(job_class: type, args: tuple[Any, ...], kwargs: dict[str, Any], lock_key: str) -> str:
    """Return the call as one JSON text; raise :class:`UnstorableCallError` naming what cannot be stored."""
    data = {
        "format": FORMAT,
        "class": class_path(job_class, "job class"),
        "args": [encode_value(a, f"args[{i}]") for i, a in enumerate(args)],
        "kwargs": {name: encode_value(v, f"kwargs[{name!r}]") for name, v in kwargs.items()},
        "lock": lock_key,
    }
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _is_job_class(cls: object) -> bool:
    """Whether ``cls`` is a UniqueJob class, without importing the job layer (which imports this module).

    A UniqueJob subclass exists only once ``uniqjob.job`` has been imported, so
    a process that has not imported it holds none.
    """
    job = sys.modules.get("uniqjob.job")
    return job is not None and isinstance(cls, type) and issubclass(cls, job.UniqueJob)


def decode_call(text: str) -> StoredCall:
    """Return the call stored by :func:`encode_call`; raise :class:`UnstorableCallError` if it cannot be."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _bad("", f"not JSON ({exc})") from None
    except RecursionError:
        raise _bad("", "nested too deeply to read") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise _bad("", f"format {found!r}, this version reads {FORMAT}")
    try:
        cls = _resolve(data["class"])
    except (ImportError, AttributeError, KeyError, TypeError) as exc:
        raise _bad("job class", f"{data.get('class')!r} cannot be imported: {exc}") from None
    if not _is_job_class(cls):
        raise _bad("job class", f"{data['class']} is not a UniqueJob")
    args, kwargs = data.get("args", []), data.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise _bad("", "args must be a list and kwargs an object")
    try:
        args = decode_value(args, "args")
        kwargs = {name: decode_value(v, f"kwargs[{name!r}]") for name, v in kwargs.items()}
    except RecursionError:
        raise _bad("", "arguments nested too deeply to read") from None
    return StoredCall(cls, tuple(args), kwargs, str(data.get("lock", "")))
