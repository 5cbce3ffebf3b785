"""Steps and their two drivers: what uniqjob.concurrency is still made of (temporary).

The job layer no longer uses them (docs/internals.md: its asyncio code is the source, its
sync code generated); the concurrency glue still writes each operation once as a generator
that *yields* each thing it needs done and is sent back the answer. :func:`drive` does
each step by calling it (the sync API); :func:`adrive` awaits it (the asyncio API). A step
is a tuple:

- ``(name, args, kwargs)``: the store primitive ``name``, called on the sync
  :class:`~uniqjob.stores.base.Backend` or awaited on its :class:`~uniqjob.stores.aio.AsyncBackend`;
- ``(function, args, kwargs)``: a call of ``function``; the async driver awaits what it returns
  if that is awaitable, the sync one refuses it (:mod:`uniqjob._callouts`);
- ``(TWIN, (call, acall, args), kwargs)``: an operation with a face of each kind: the sync
  driver calls ``call(*args, **kwargs)``, the async one awaits ``acall(*args, **kwargs)``.

An exception a step raises is thrown into the generator at its ``yield``, so
it is handled (or not) exactly where the sync code would have seen it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

from ._callouts import awaitable, refuse
from .stores.aio import async_backend
from .stores.base import Backend

__all__ = ["TWIN", "Step", "Steps", "adrive", "called", "drive", "twin_of"]

T = TypeVar("T")

#: One step: what to do, its positional and its keyword arguments.
Step = tuple[Any, tuple[Any, ...], dict[str, Any]]
#: A transition: yields steps, is sent their answers, returns its result.
Steps = Generator[Step, Any, T]

#: The first item of a step with a sync and an async face (see :func:`twin_of`).
TWIN = object()

_NO_KWARGS: dict[str, Any] = {}


def twin_of(call: Callable[..., Any], acall: Callable[..., Any], *args: Any, **kwargs: Any) -> Step:
    """The step that calls ``call(*args, **kwargs)`` (sync path) or awaits ``acall(*args, **kwargs)``."""
    return (TWIN, (call, acall, args), kwargs)


def called(function: Callable[..., Any], *args: Any) -> Steps[Any]:
    """Steps of one call, ``function(*args)`` (awaited on the async path if it returns an awaitable)."""
    return (yield (function, args, _NO_KWARGS))


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
            elif what is TWIN:
                reply, error = args[0](*args[2], **kwargs), None
            else:
                reply, error = what(*args, **kwargs), None
                if awaitable(reply):
                    refuse(what, reply)
        except BaseException as exc:  # thrown into the steps, as adrive() does
            reply, error = None, exc


async def adrive(store: Backend, steps: Steps[T]) -> T:
    """Run ``steps`` to the end, awaiting each step (the asyncio API); return its result.

    A store primitive is awaited on the store's async face; a function step's
    reply is awaited if it is awaitable.
    """
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
            elif what is TWIN:
                reply, error = await args[1](*args[2], **kwargs), None
            else:
                reply, error = what(*args, **kwargs), None
                if awaitable(reply):
                    reply = await reply
        except BaseException as exc:  # thrown into the steps (a cancellation too: they release theirs)
            reply, error = None, exc
