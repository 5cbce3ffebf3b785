"""The job layer's decisions as generators of steps, and the two drivers that run them.

A lock or job transition (take the locks, reclaim an orphan, perform, release)
is written once, as a generator that *yields* each thing it needs done and is
sent back the answer. :func:`drive` does each step by calling it (the sync
API); :func:`adrive` awaits it (the asyncio API). The decisions are the same
code on both paths; only the I/O differs. A step is a tuple:

- ``(name, args, kwargs)``: the store primitive ``name`` (``"claim"``,
  ``"start"``, ...), called on the sync :class:`~uniqjob.stores.base.Backend`
  or awaited on its :class:`~uniqjob.stores.aio.AsyncBackend`;
- ``(function, args, kwargs)``: a call of ``function`` (``perform``, a queue's
  ``push`` or ``job_gone``); the async driver awaits what it returns if that
  is awaitable, the sync one refuses it (an async function reached through the
  sync API would otherwise run unawaited, unlocked);
- ``(SLEEP, (seconds, sleep), {})``: a wait (``sleep(seconds)``, or ``asyncio.sleep``);
- ``(TWIN, (call, acall, args), kwargs)``: an operation with a face of each kind (a
  concurrency semaphore store's primitive, a wait for a wake-up): the sync
  driver calls ``call(*args, **kwargs)``, the async one awaits ``acall(*args, **kwargs)``.

An exception a step raises is thrown into the generator at its ``yield``, so
it is handled (or not) exactly where the sync code would have seen it.
"""

from __future__ import annotations

import inspect
import time
from abc import get_cache_token
from collections.abc import Callable, Generator
from types import GeneratorType
from typing import Any, TypeVar

from .errors import ConfigurationError
from .stores.aio import async_backend
from .stores.base import Backend

__all__ = ["SLEEP", "TWIN", "Step", "Steps", "adrive", "drive", "sleep_of", "twin_of"]

T = TypeVar("T")

#: One step: what to do, its positional and its keyword arguments.
Step = tuple[Any, tuple[Any, ...], dict[str, Any]]
#: A transition: yields steps, is sent their answers, returns its result.
Steps = Generator[Step, Any, T]

#: The first item of a wait step.
SLEEP = object()
#: The first item of a step with a sync and an async face (see :func:`twin_of`).
TWIN = object()

_NO_KWARGS: dict[str, Any] = {}


def sleep_of(seconds: float, sleep: Callable[[float], None] = time.sleep) -> Step:
    """The step that waits ``seconds``: ``sleep`` on the sync path, ``asyncio.sleep`` on the async one."""
    return (SLEEP, (seconds, sleep), _NO_KWARGS)


def twin_of(call: Callable[..., Any], acall: Callable[..., Any], *args: Any, **kwargs: Any) -> Step:
    """The step that calls ``call(*args, **kwargs)`` (sync path) or awaits ``acall(*args, **kwargs)``."""
    return (TWIN, (call, acall, args), kwargs)


def drive(store: Backend, steps: Steps[T]) -> T:
    """Run ``steps`` to the end, calling each step (the sync API); return its result.

    A store primitive is called straight on ``store``; only a function step's
    reply is checked for an awaitable (which the sync API refuses).
    """
    send, throw = steps.send, steps.throw
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            what, args, kwargs = send(reply) if error is None else throw(error)
        except StopIteration as done:
            result: T = done.value
            return result
        try:
            if type(what) is str:
                reply, error = getattr(store, what)(*args, **kwargs), None
            elif what is SLEEP:
                reply, error = args[1](args[0]), None
            elif what is TWIN:
                reply, error = args[0](*args[2], **kwargs), None
            else:
                reply, error = what(*args, **kwargs), None
                if _awaitable(reply):
                    _refuse(what, reply)
        except BaseException as exc:  # thrown into the steps, as adrive() does
            reply, error = None, exc


async def adrive(store: Backend, steps: Steps[T]) -> T:
    """Run ``steps`` to the end, awaiting each step (the asyncio API); return its result.

    A store primitive is awaited on the store's async face; a function step's
    reply is awaited if it is awaitable; a wait is ``asyncio.sleep``.
    """
    import asyncio  # here: the sync API (a cron script, ``uniqjob run``) never loads it

    astore = async_backend(store)
    send, throw = steps.send, steps.throw
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            what, args, kwargs = send(reply) if error is None else throw(error)
        except StopIteration as done:
            result: T = done.value
            return result
        try:
            if type(what) is str:
                reply, error = await astore.call(what, args, kwargs), None
            elif what is SLEEP:
                await asyncio.sleep(args[0])
                reply, error = None, None
            elif what is TWIN:
                reply, error = await args[1](*args[2], **kwargs), None
            else:
                reply, error = what(*args, **kwargs), None
                if _awaitable(reply):
                    reply = await reply
        except BaseException as exc:  # thrown into the steps (a cancellation too: they release theirs)
            reply, error = None, exc


#: Types none of whose instances is awaitable, each with the ABC cache token it was found at (the
#: token changes whenever any ABC gains a registered subclass, which might make one awaitable).
_PLAIN: dict[type, object] = {}
_PLAIN_MAX = 256  # kinds of reply kept (then it starts afresh): a bound for classes made at run time


def _awaitable(reply: Any) -> bool:
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
    if inspect.isawaitable(reply):
        return True
    if own and kind is not GeneratorType:
        if len(_PLAIN) >= _PLAIN_MAX:
            _PLAIN.clear()
        _PLAIN[kind] = token
    return False


def _refuse(what: Any, awaitable: Any) -> Any:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()  # never awaited: no "coroutine was never awaited" warning on top of the error
    name = getattr(what, "__qualname__", repr(what))
    raise ConfigurationError(
        f"{name} is async (it returned {type(awaitable).__name__}): call it through the asyncio API "
        "(await Job.arun(...), await Job.aenqueue(...))"
    )
