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

import asyncio
import inspect
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from .errors import ConfigurationError
from .stores.aio import AsyncBackend, async_backend
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
            else:
                reply, error = _called(what, args, kwargs), None
        except BaseException as exc:  # thrown into the steps, as adrive() does
            reply, error = None, exc


async def adrive(store: Backend, steps: Steps[T]) -> T:
    """Run ``steps`` to the end, awaiting each step (the asyncio API); return its result."""
    return await _run(steps, async_backend(store))


async def _run(steps: Steps[T], astore: AsyncBackend) -> T:
    """Send each step's awaited answer into ``steps``, or throw what it raised, until they return."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as done:
            result: T = done.value
            return result
        try:
            reply, error = await _awaited(astore, step), None
        except (
            BaseException
        ) as exc:  # thrown into the steps (a cancellation too: they release what they hold)
            reply, error = None, exc


def _called(what: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A step that is not a store primitive, called: a wait, or a function (refused if it is async)."""
    if what is SLEEP:
        return args[1](args[0])
    if what is TWIN:
        return args[0](*args[2], **kwargs)
    reply = what(*args, **kwargs)
    return _refuse(what, reply) if _awaitable(reply) else reply


async def _awaited(astore: AsyncBackend, step: Step) -> Any:
    what, args, kwargs = step
    if type(what) is str:
        return await astore.call(what, args, kwargs)
    if what is SLEEP:
        return await asyncio.sleep(args[0])
    if what is TWIN:
        return await args[1](*args[2], **kwargs)
    reply = what(*args, **kwargs)
    return (await reply) if _awaitable(reply) else reply


def _awaitable(reply: Any) -> bool:
    """``inspect.isawaitable(reply)``, None (a dropped duplicate's, most functions') answered at once."""
    return reply is not None and inspect.isawaitable(reply)


def _refuse(what: Any, awaitable: Any) -> Any:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()  # never awaited: no "coroutine was never awaited" warning on top of the error
    name = getattr(what, "__qualname__", repr(what))
    raise ConfigurationError(
        f"{name} is async (it returned {type(awaitable).__name__}): call it through the asyncio API "
        "(await Job.arun(...), await Job.aenqueue(...))"
    )
