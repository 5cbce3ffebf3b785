"""Calls out of the library (``perform``, a queue's ``push`` or ``job_gone``, a ``settle``), from either API.

The asyncio API awaits what such a call returns if it is awaitable (an ``async def``
``perform``, arq's queue): :func:`acall_out`. The sync API cannot, and an awaitable left
unawaited would run nothing, unlocked: :func:`call_out` refuses it with
:class:`ConfigurationError`. The job layer's twins call one or the other (scripts/unasync.py
turns ``acall_out`` into ``call_out``).
"""

from __future__ import annotations

from abc import get_cache_token
from collections.abc import Callable
from types import GeneratorType
from typing import Any, NoReturn

from .errors import ConfigurationError

__all__ = ["acall_out", "awaitable", "call_out", "refuse"]


def call_out(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, refused if what it returns is awaitable (see the module)."""
    reply = function(*args)
    if awaitable(reply):
        refuse(function, reply)
    return reply


async def acall_out(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, its answer awaited if it is awaitable."""
    reply = function(*args)
    if awaitable(reply):
        reply = await reply
    return reply


#: Types none of whose instances is awaitable, each with the ABC cache token it was found at (the
#: token changes whenever any ABC gains a registered subclass, which might make one awaitable).
_PLAIN: dict[type, object] = {}
_PLAIN_MAX = 256  # kinds of reply kept (then it starts afresh): a bound for classes made at run time


def awaitable(reply: Any) -> bool:
    """``inspect.isawaitable(reply)``, sooner: None (a dropped duplicate's, most functions') and the
    instances of a type seen before to be plain (a queue's job handle) are answered at once."""
    if reply is None:
        return False
    kind = type(reply)
    token = get_cache_token()
    # An object whose __class__ is not its type (a proxy) is tested by that class too, and a
    # generator's answer is its own (its code's flags): neither is answered by its type alone.
    own = reply.__class__ is kind
    if own and _PLAIN.get(kind) == token:
        return False
    import inspect  # here: a sync run's import need not load it

    if inspect.isawaitable(reply):
        return True
    if own and kind is not GeneratorType:
        if len(_PLAIN) >= _PLAIN_MAX:
            _PLAIN.clear()
        _PLAIN[kind] = token
    return False


def refuse(what: Any, reply: Any) -> NoReturn:
    """Raise the error of an async ``what`` reached through the sync API (``reply`` is closed unawaited)."""
    close = getattr(reply, "close", None)
    if close is not None:
        close()  # never awaited: no "coroutine was never awaited" warning on top of the error
    name = getattr(what, "__qualname__", repr(what))
    raise ConfigurationError(
        f"{name} is async (it returned {type(reply).__name__}): call it through the asyncio API "
        "(await Job.arun(...), await Job.aenqueue(...))"
    )
