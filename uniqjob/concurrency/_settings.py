"""A job class's concurrency settings: checked when the class is defined, and resolved per call.

:func:`check` refuses a bad ``concurrency_*`` setting by name; :func:`key_of`
and :func:`semaphore_of` turn a call's arguments into its concurrency key and
the :class:`~.semaphore.Semaphore` it counts against.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ConfigurationError
from ..keys import digest
from ..settings import one_of, seconds
from ._stores import store_for
from .semaphore import Semaphore

if TYPE_CHECKING:
    from ..job import UniqueJob

__all__ = ["POLICIES", "ConcurrencyPolicy", "check", "key_of", "semaphore_of"]

ConcurrencyPolicy = Literal["block", "discard", "raise"]
POLICIES: tuple[ConcurrencyPolicy, ...] = ("block", "discard", "raise")

_KEY_TEXT_MAX = 200  # a longer key value is digested, like any non-text one


def _seconds(value: object, what: str, *, allow_none: bool = False) -> float | None:
    if value is None and not allow_none:
        raise ConfigurationError(f"{what} must be set")
    return seconds(value, what)


def check(cls: type[UniqueJob]) -> None:
    """Raise :class:`ConfigurationError` naming the first bad ``concurrency_*`` setting of ``cls``."""
    name = cls.__qualname__
    own = [attr for attr in vars(cls) if attr.startswith("concurrency_")]  # none unknown: _names refused them
    key = inspect.getattr_static(cls, "concurrency_key")
    if not isinstance(key, (classmethod, staticmethod)):
        raise ConfigurationError(f"{name}.concurrency_key must be a classmethod taking perform's arguments")
    limit = cls.concurrency_limit
    if limit is None:
        stray = sorted(a for a in own if a != "concurrency_limit")
        if stray:
            raise ConfigurationError(f"{name}.{stray[0]} has no effect without concurrency_limit")
        return
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ConfigurationError(
            f"{name}.concurrency_limit must be a whole number >= 1 or None, got {limit!r}"
        )
    _seconds(cls.concurrency_duration, f"{name}.concurrency_duration")
    one_of(name, "concurrency_on_conflict", cls.concurrency_on_conflict, POLICIES)
    _seconds(cls.concurrency_wait_timeout, f"{name}.concurrency_wait_timeout", allow_none=True)


def key_of(cls: type[UniqueJob], args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """Return the concurrency key of a call: ``module.QualName``, then ``:`` and the key value.

    A short printable text is kept as written (``order-42``), so people can
    read it in ``uniqjob locks``; any other value becomes a digest of its
    canonical encoding (``#3f0a...``), as lock keys do.
    """
    value = cls.concurrency_key(*args, **kwargs)
    base = cls.job_name()
    if value is None:
        return base
    if (
        isinstance(value, str)
        and value
        and len(value) <= _KEY_TEXT_MAX
        and value.isprintable()
        and not value.startswith("#")
    ):
        return f"{base}:{value}"
    return f"{base}:#{digest(value, 'concurrency_key()')}"


def semaphore_of(cls: type[UniqueJob], args: Sequence[Any], kwargs: dict[str, Any]) -> Semaphore:
    """Return the semaphore a call of ``cls`` with these arguments counts against."""
    if cls.concurrency_limit is None:
        raise ConfigurationError(f"{cls.__qualname__} has no concurrency_limit")
    interval = float(cls.unique_run_lease) / 3
    duration = _seconds(cls.concurrency_duration, f"{cls.__qualname__}.concurrency_duration")
    assert duration is not None
    return Semaphore(
        store_for(cls.backend()),
        key_of(cls, args, kwargs),
        limit=cls.concurrency_limit,
        lease=max(duration, 2 * interval),  # floored at two heartbeats
        interval=interval,
        job_class=cls.job_name(),
    )
