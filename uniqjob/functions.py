"""``@unique``: a plain function as a unique job, without writing a class.

::

    @unique(lock_autoexpire=3600, on_conflict="raise", args=("account_id",))
    def send_report(account_id: int, note: str = "") -> str: ...

    send_report(42)           # runs under the lock, like Job.run(); None when a duplicate is dropped
    send_report.enqueue(42)   # with queue=RQQueue(q): the queue lock at enqueue, the run lock in the worker

The decorator builds a real :class:`~uniqjob.job.UniqueJob` subclass (its
``perform`` is the function, its settings the decorator's options, checked as a
class's are) and returns a :class:`UniqueFunction` that calls through it. The
job name, the start of every key, is the function's ``module.QualName``, as a
class's is: ``send_report(42)`` has the key ``make_key("mod.send_report",
{"account_id": 42})``. The returned object is importable and pickles by its
name, so a queue's own API (``q.enqueue(send_report, 42)``) ships a reference
to it, and the worker calls it: under the run lock.

On an ``async def`` function it returns an :class:`AsyncUniqueFunction`: calling
it returns a coroutine that holds the lock while it is awaited (``Job.arun``).

On an instance method (a function defined in a class body whose first
parameter is ``self``), ``self`` is left out of the key unless ``args`` names
it. (Under ``@classmethod`` or ``@staticmethod`` it is not typed: decorate a
module-level function instead.)
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, Self, TypeVar, overload

from . import _percall
from ._names import did_you_mean
from .errors import ConfigurationError
from .job import UniqueJob
from .joblock import JobLock

__all__ = ["OPTIONS", "AsyncUniqueFunction", "UniqueFunction", "unique"]

P = ParamSpec("P")
Q = ParamSpec("Q")
R = TypeVar("R")
S = TypeVar("S")

#: Each option of ``@unique`` and the UniqueJob setting it sets: the ``unique_*``
#: settings without the prefix, the ``concurrency_*`` ones under their own names.
OPTIONS: dict[str, str] = {
    name.removeprefix("unique_"): name
    for name in sorted(vars(UniqueJob))
    if name.startswith(("unique_", "concurrency_"))
}

# What a function has beyond functools.WRAPPER_ASSIGNMENTS: inspect reads these of a function.
_FUNCTION_ATTRS = ("__code__", "__defaults__", "__kwdefaults__", "__globals__", "__closure__", "__builtins__")

# Settings that are functions of the call: kept as staticmethods (UniqueJob calls them on the class).
_CALLABLES = frozenset({"unique_key", "concurrency_key", "unique_on_lost"})


class UniqueFunction(Generic[P, R]):
    """A function decorated with :func:`unique`: calling it runs it under its lock.

    ``unique_job`` is the UniqueJob class behind it. Every method takes the
    function's own arguments.
    """

    unique_job: type[UniqueJob]
    __name__: str
    __qualname__: str
    __wrapped__: Callable[P, R]

    def __init__(self, function: Callable[P, R], job: type[UniqueJob], bound: tuple[Any, ...] = ()) -> None:
        functools.update_wrapper(self, function)
        self.unique_job = job
        self._function = function
        self._bound = bound  # (instance,) when reached through an instance: a bound method
        # The rest of what makes a function, so that what reads a function's own attributes
        # (inspect, doctest, RQ) reads the function's.
        for attr in _FUNCTION_ATTRS:
            if hasattr(function, attr):
                setattr(self, attr, getattr(function, attr))

    @property  # type: ignore[misc]
    def __class__(self) -> type[Any]:
        """A plain function's type for ``isinstance``, as a proxy's is its target's; ``type()`` is true.

        Queues decide by ``inspect.isfunction`` how to refer to a callable: RQ ships
        a function by its ``module.qualname`` and shows ``module.send_report(43)``,
        anything else as the object and ``__call__(43)``. Reached through an
        instance, it is a bound method, and says what it really is.
        """
        if inspect.isfunction(self._function) and not self._bound:
            return types.FunctionType
        return type(self)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R | None:
        """Lock, run the function, release; its result, or None when the call is a dropped duplicate."""
        result: R | None = self.unique_job.run(*self._bound, *args, **kwargs)
        return result

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Take the queue lock and hand the call to the ``queue`` option's queue (none: run it now)."""
        return self.unique_job.enqueue(*self._bound, *args, **kwargs)

    def using(self, **settings: Any) -> Self:
        """This function with other settings for one call: ``send_report.using(on_conflict="raise")(42)``.

        The settings are the options without ``unique_`` that a call may give
        (``on_conflict``, ``lock_autoexpire``, ``reschedule_delay``), checked as the decorator's are.
        """
        where = f"{self.unique_job.job_name()}.using()"
        return type(self)(self._function, _percall.using(self.unique_job, settings, where=where), self._bound)

    def lock_key(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Return the lock key of a call with these arguments."""
        return self.unique_job.lock_key(*self._bound, *args, **kwargs)

    def is_locked(self, *args: P.args, **kwargs: P.kwargs) -> bool:
        """True when a call with these arguments would conflict now."""
        return self.unique_job.is_locked(*self._bound, *args, **kwargs)

    def lock(self, *args: P.args, **kwargs: P.kwargs) -> JobLock:
        """Return a new :class:`JobLock` for a call with these arguments (nothing is taken yet)."""
        return self.unique_job.lock(*self._bound, *args, **kwargs)

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> UniqueFunction[P, R]: ...

    @overload
    def __get__(
        self: UniqueFunction[Concatenate[S, Q], R], instance: S, owner: type[Any] | None = None
    ) -> UniqueFunction[Q, R]: ...

    def __get__(self, instance: object, owner: type[Any] | None = None) -> UniqueFunction[Any, R]:
        """Reached through an instance: the same function with ``instance`` as its first argument."""
        if instance is None:
            return self
        return type(self)(self._function, self.unique_job, (instance,))

    def __reduce__(self) -> str | tuple[Any, ...]:
        # Pickled by reference, as a function is: a worker imports it by its name.
        if self._bound:
            return getattr, (self._bound[0], self.__name__)
        return self.__qualname__

    def __repr__(self) -> str:
        return f"<unique function {self.unique_job.job_name()}>"


class AsyncUniqueFunction(UniqueFunction[P, Coroutine[Any, Any, R]]):
    """An ``async def`` function decorated with :func:`unique`: awaiting a call runs it under its lock.

    It stays a coroutine function to ``inspect.iscoroutinefunction`` and
    ``asyncio.iscoroutinefunction``, which frameworks check (Starlette and
    FastAPI endpoints, arq's ``func``, pytest): it carries the function's
    ``__code__`` (Python 3.11 reads its flags), and on 3.12+ the mark of
    ``inspect.markcoroutinefunction``.
    """

    def __init__(
        self,
        function: Callable[P, Coroutine[Any, Any, R]],
        job: type[UniqueJob],
        bound: tuple[Any, ...] = (),
    ) -> None:
        super().__init__(function, job, bound)  # __code__, whose flags say "coroutine" to 3.11
        if sys.version_info >= (3, 12):
            inspect.markcoroutinefunction(self)

    def __call__(  # type: ignore[override]
        self, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R | None]:
        """A coroutine that locks, awaits the function, releases: its result, or None if dropped."""
        call: Coroutine[Any, Any, R | None] = self.unique_job.arun(*self._bound, *args, **kwargs)
        return call

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """:meth:`enqueue`, awaited (an async queue, or none: the call awaited now)."""
        return await self.unique_job.aenqueue(*self._bound, *args, **kwargs)

    async def ais_locked(self, *args: P.args, **kwargs: P.kwargs) -> bool:
        """:meth:`is_locked`, awaited."""
        return await self.unique_job.ais_locked(*self._bound, *args, **kwargs)


class _Decorator(Protocol):
    """What ``unique(**options)`` returns: it decorates a sync or an ``async def`` function."""

    @overload
    def __call__(self, function: Callable[P, Awaitable[R]], /) -> AsyncUniqueFunction[P, R]: ...

    @overload
    def __call__(self, function: Callable[P, R], /) -> UniqueFunction[P, R]: ...


@overload
def unique(function: Callable[P, Awaitable[R]], /) -> AsyncUniqueFunction[P, R]: ...


@overload
def unique(function: Callable[P, R], /) -> UniqueFunction[P, R]: ...


@overload
def unique(**options: Any) -> _Decorator: ...


def unique(function: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Make a function a unique job; ``options`` are the UniqueJob settings (see :data:`OPTIONS`).

    ``@unique`` alone takes every default. A misspelt option or a bad value is a
    :class:`ConfigurationError` here, when the function is decorated.
    """
    settings = _settings(options)
    if function is not None:
        return _decorate(function, settings)
    return lambda function: _decorate(function, settings)


def _settings(options: dict[str, Any]) -> dict[str, Any]:
    """The class attributes for ``options``; ConfigurationError naming an unknown one."""
    attrs: dict[str, Any] = {}
    for option, value in options.items():
        attr = OPTIONS.get(option)
        if attr is None:
            hint = did_you_mean(option, OPTIONS)
            raise ConfigurationError(
                f"@unique has no option {option!r} ({hint}options: {', '.join(OPTIONS)})"
            )
        if attr in _CALLABLES and value is not None:
            if not callable(value):
                raise ConfigurationError(
                    f"@unique option {option!r} must be a function of the call, got {type(value).__name__}"
                )
            attrs[attr] = staticmethod(value)
        else:
            attrs[attr] = value
    return attrs


def _decorate(function: Callable[..., Any], attrs: dict[str, Any]) -> UniqueFunction[Any, Any]:
    if not callable(function) or isinstance(function, type):
        raise ConfigurationError(f"@unique decorates a function, got {function!r}")
    name = getattr(function, "__qualname__", None)
    module = getattr(function, "__module__", None)
    if not isinstance(name, str) or not isinstance(module, str):
        raise ConfigurationError(f"@unique needs a function with a name and a module, got {function!r}")
    if inspect.isasyncgenfunction(function):
        raise ConfigurationError(
            f"@unique decorates a function or an async function, not async generator {module}.{name}"
        )
    attrs = dict(attrs)
    params = list(inspect.signature(function).parameters)
    if "unique_args" not in attrs and _is_method(name, params):
        attrs["unique_args"] = tuple(params[1:])  # self is not part of the key
    body: dict[str, Any] = {"__module__": module, "__qualname__": name, "__doc__": function.__doc__}
    body["perform"] = staticmethod(function)
    try:
        job = type(function.__name__, (UniqueJob,), {**body, **attrs})
    except ConfigurationError as exc:
        raise ConfigurationError(_in_options(str(exc), name, module)) from None
    kind = AsyncUniqueFunction if inspect.iscoroutinefunction(function) else UniqueFunction
    return kind(function, job)


def _is_method(qualname: str, params: list[str]) -> bool:
    """Defined in a class body (not in a function) with ``self`` first: an instance method."""
    parts = qualname.split(".")
    return len(parts) > 1 and parts[-2] != "<locals>" and params[:1] == ["self"]


def _in_options(message: str, name: str, module: str) -> str:
    """A class's settings error (``f.unique_strategy must ...``) in the decorator's terms (``strategy=``)."""
    for option, attr in OPTIONS.items():
        prefix = f"{name}.{attr}"
        if message.startswith(prefix) and message[len(prefix) : len(prefix) + 1] in (" ", ":"):
            return f"@unique({option}=...) on {module}.{name}: {option}{message[len(prefix) :]}"
    return f"@unique on {module}.{name}: {message}"
