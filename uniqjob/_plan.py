"""A job class's plan, made once when the class is defined, and the one lock builder.

:func:`plan_of` records what a class's definition decides about its calls:
``perform``'s signature and binder, whether ``unique_key`` is the class's own,
the default key's :class:`~uniqjob.keys.KeyPlan`, and whether the class keeps
every hook that makes a lock. :func:`build_lock` is the one place where a
class's ``unique_*`` settings become a :class:`~uniqjob.joblock.JobLock`.
The settings themselves are read at each call, so one assigned after the class
is defined (a test, a worker configuring itself) still counts.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from . import _coalesce, config, settings
from ._calls import Binder, binder, describe_call
from ._ticks import tick_of
from .errors import UniqueKeyError
from .joblock import JobLock
from .keys import KeyPlan
from .locks import QueueMeta

if TYPE_CHECKING:
    from .job import UniqueJob

__all__ = ["LOCK_HOOKS", "JobPlan", "build_lock", "plan_of", "planned_key"]

#: The UniqueJob methods that make a call's lock; a class overriding none of them (but maybe
#: ``job_name``, which is then called once per lock) is ``plain``.
LOCK_HOOKS = ("lock", "lock_key", "unique_key", "job_name", "backend", "autoexpire")


@dataclass(frozen=True, slots=True)
class JobPlan:
    """What a job class's definition decides about its calls' keys and locks."""

    #: ``perform``'s signature without ``self``; None while ``perform`` is UniqueJob's own.
    signature: inspect.Signature | None = None
    #: Binds a call to ``perform``'s parameters (see :func:`uniqjob._calls.binder`); None: ``Signature.bind``.
    bind: Binder | None = None
    #: ``perform`` is a classmethod or staticmethod, called on the class rather than on an instance.
    bound: bool = False
    #: The class defines its own ``unique_key``.
    custom_key: bool = False
    #: The default key of a signature of plain parameters, planned once; None: through ``unique_key()``.
    key: KeyPlan | None = None
    #: The class overrides none of :data:`LOCK_HOOKS` but ``job_name``: its locks may be made without
    #: calling them (a queue integration's job class names itself after its task: Celery, Huey, Dramatiq).
    plain: bool = True
    #: The class overrides ``job_name``: a plain lock is named by one call of it.
    named: bool = False
    #: ``perform`` is an ``async def``: it is awaited under the locks, by the asyncio API only.
    asynchronous: bool = False

    def arguments(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """Return a call's arguments by name, defaults applied, as ``Signature.bind`` gives them.

        None while ``perform`` is UniqueJob's own; :class:`UniqueKeyError` if they do not fit it.
        """
        signature = self.signature
        if signature is None:
            return None
        arguments = None if self.bind is None else self.bind(args, kwargs)
        if arguments is not None:
            return arguments
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            reason = f"arguments do not match perform{signature}: {exc}"
            raise UniqueKeyError(_param_in(str(exc)), reason) from None
        bound.apply_defaults()
        return bound.arguments


def plan_of(cls: type[UniqueJob], base: type[UniqueJob]) -> JobPlan:
    """Return the plan of job class ``cls``, a subclass of ``base`` (UniqueJob itself)."""
    perform = inspect.getattr_static(cls, "perform")
    signature: inspect.Signature | None = None
    bind: Binder | None = None
    bound = False
    if perform is not inspect.getattr_static(base, "perform"):
        bound = isinstance(perform, (classmethod, staticmethod))
        signature = inspect.signature(cls.perform)
        if not bound:  # drop ``self``
            signature = signature.replace(parameters=list(signature.parameters.values())[1:])
        bind = binder(signature)
    custom_key = inspect.getattr_static(cls, "unique_key") is not inspect.getattr_static(base, "unique_key")
    key = None
    if signature is not None and bind is not None and not custom_key:
        params = signature.parameters.values()
        defaults = [p.default for p in params if p.default is not inspect.Parameter.empty]
        key = KeyPlan(list(signature.parameters), defaults)
    static = inspect.getattr_static
    hooks = {name for name in LOCK_HOOKS if static(cls, name) is not static(base, name)}  # overridden
    function = getattr(perform, "__func__", perform)  # a classmethod's or staticmethod's function
    return JobPlan(
        signature,
        bind,
        bound,
        custom_key,
        key,
        plain=hooks <= {"job_name"},
        named="job_name" in hooks,
        asynchronous=inspect.iscoroutinefunction(function),
    )


def planned_key(cls: type[UniqueJob], name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The default key of a call, by the class's :class:`KeyPlan`; None if not planned.

    The same key as ``make_key(name, unique_key(...))``, sooner: the usual call on every enqueue.
    """
    plan = cls._plan.key
    if plan is None or cls.unique_args is not None:
        return None
    given = len(args)
    if not kwargs and plan.required <= given <= plan.size:  # positional, defaults trailing
        return plan.key(name, args + plan.defaults[given:] if given < plan.size else args)
    bind = cls._plan.bind
    bound = None if bind is None else bind(args, kwargs)
    return None if bound is None else plan.key(name, list(bound.values()))  # None: the hooks raise


def build_lock(
    cls: type[UniqueJob],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    key: str | None = None,
    token: str | None = None,
    adopt: bool = False,
) -> JobLock:
    """Return a new JobLock for a call of ``cls``, made from the class's settings.

    The one place the settings become a lock. ``key`` is the call's lock key
    (None: ``lock_key(*args, **kwargs)``'s); ``token`` and ``adopt`` are a
    worker's, rebuilding a job's lock from the key and token it was sent.
    """
    plan = cls._plan
    period: object = cls.unique_once_per
    tick = key is None and period is not None  # a worker's given key has its tick already
    if plan.plain:
        # UniqueJob's own lock_key(), job_name(), backend() and autoexpire(), in line: the
        # same values, without four calls on the path of every enqueue.
        name = cls.job_name() if plan.named else f"{cls.__module__}.{cls.__qualname__}"
        if key is None:
            key = planned_key(cls, name, args, kwargs) or cls.lock_key(*args, **kwargs)
        target = cls.unique_backend
        backend = config.default_backend() if target is None else config.resolve(target)
        ttl = None if cls.unique_lock_autoexpire is None else cls.autoexpire()
    else:
        if key is None:
            key = cls.lock_key(*args, **kwargs)
        backend, ttl, name = cls.backend(), cls.autoexpire(), cls.job_name()
    strategy = cls.unique_strategy
    if period is not None:
        strategy = "until_expired"  # kept to the tick's end
        seconds = settings.once_per(period, f"{cls.__qualname__}.unique_once_per")
        if tick and seconds is not None:
            now = tick_of(backend, key, seconds)
            key, ttl = now.key, now.ttl
    coalesce = _coalesce.mode(cls)
    # a keep_last call's arguments travel in its claim; a worker's rebuilt lock has none to send
    call = _coalesce.encode(cls, args, kwargs) if coalesce == "keep_last" and token is None else ""
    lock = JobLock(
        backend,
        key,
        token=token,
        lease=float(cls.unique_run_lease),
        ttl=ttl,
        meta=QueueMeta(name, describe_call(args, kwargs), "", call),
        adopt=adopt,
        strategy=strategy,
        limit=cls.unique_lock_limit,
        on_lost=cls.unique_on_lost,
        coalesce=coalesce,
        debounce=settings.debounce(cls) if cls.unique_debounce is not None else None,
    )
    if coalesce == "keep_last":
        lock.hand_on = partial(_coalesce.hand_on, cls)
    return lock


def _param_in(message: str) -> str:
    """Pull the parameter name out of a ``Signature.bind`` error, if it names one."""
    start = message.find("'")
    end = message.find("'", start + 1)
    return message[start + 1 : end] if 0 <= start < end else ""
