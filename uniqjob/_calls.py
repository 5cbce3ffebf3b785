"""A call's arguments, fast: bound to ``perform``'s parameters, and previewed for people.

Every enqueue does both, and the general tools (``Signature.bind``,
``reprlib``) cost as much as the rest of the key; these give the same results
for the usual calls and leave every other call to them.
"""

from __future__ import annotations

import inspect
import reprlib
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Binder", "binder", "describe_call", "preview", "show"]

#: Binds a call's arguments to perform's parameters; see :func:`binder`.
Binder = Callable[[Sequence[Any], dict[str, Any]], dict[str, Any] | None]

_PREVIEW_MAX = 40
_CALL_MAX = 200  # the whole preview of a call
_SHORT_INT = 10**_PREVIEW_MAX  # an int below it in size is shown by repr() whole


class _Preview(reprlib.Repr):
    """reprlib's shortening, and an int too long for ``str()`` (4300 digits) named by its size."""

    def repr_int(self, x: int, level: int) -> str:
        try:
            return super().repr_int(x, level)
        except ValueError:
            return f"<int of {x.bit_length()} bits>"


#: How an argument is shown in a lock's preview (and, for any value, the reference for :func:`show`).
preview = _Preview()
preview.maxstring = _PREVIEW_MAX
preview.maxother = _PREVIEW_MAX


def binder(signature: inspect.Signature) -> Binder | None:
    """A fast ``bind`` + ``apply_defaults`` for a signature of plain parameters; None for any other.

    The binder returns the same dict as ``Signature.bind`` (defaults applied,
    in the signature's order), or None where ``bind`` would raise, so the
    caller asks ``bind`` for the error.
    """
    params = list(signature.parameters.values())
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return None
    names = tuple(p.name for p in params)
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    count = len(names)

    def bind(args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        given = len(args)
        if given > count:
            return None
        bound = dict(zip(names, args, strict=False))  # the first len(args) names
        if given == count and not kwargs:
            return bound
        used = 0
        for name in names[given:]:
            if name in kwargs:
                bound[name] = kwargs[name]
                used += 1
            elif name in defaults:
                bound[name] = defaults[name]
            else:
                return None  # missing
        return bound if used == len(kwargs) else None  # else an unknown name, or one given twice

    return bind


def describe_call(args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """A short preview of a call's arguments, for people reading the lock."""
    if kwargs:
        parts = [show(a) for a in args[:6]]
        parts += [f"{k}={show(v)}" for k, v in list(kwargs.items())[:6]]
        text = ", ".join(parts)
    elif len(args) == 1:
        text = show(args[0])  # the usual call, without building a list
    elif args:
        text = ", ".join([show(a) for a in args[:6]])
    else:
        return ""  # a worker rebuilding a lock from its key
    return text if len(text) <= _CALL_MAX else text[: _CALL_MAX - 3] + "..."


def show(value: Any) -> str:
    """Return ``preview.repr(value)``, sooner for a short int or str."""
    # The usual arguments, a short int or str, without reprlib's dispatch: its
    # repr_int and repr_str return exactly repr() for these (nothing to shorten).
    kind = type(value)
    if (kind is int and -_SHORT_INT < value < _SHORT_INT) or (kind is str and len(value) <= _PREVIEW_MAX):
        text = repr(value)
        if len(text) <= _PREVIEW_MAX:
            return text
    return preview.repr(value)
