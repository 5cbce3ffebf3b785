"""Settings for one call: ``Export.using(on_conflict="raise", lock_autoexpire=60).enqueue(42)``.

:func:`using` returns a subclass of the job class holding the given settings,
with the class's module, name and qualname: its keys, its jobs' names in a
queue (and a queue's dashboard) and the worker's reference to it
(``module:QualName``) are the class's own. Its settings are checked when it is
made, as a class's are when it is defined, so a bad value is a
:class:`ConfigurationError` before anything is locked. One is made per class
and set of settings and kept (the last :data:`KEPT` of them).

The names are the ``unique_*`` settings without their prefix (Celery's
``apply_async`` and the RQ and arq ``enqueue_call`` take them with it, as
``unique_on_conflict=...``). Only the settings that the calling side applies
can be given for one call (:data:`PER_CALL`); the others (:data:`REFUSED`) are
read by the worker from the class, or shared by every call of a key, and are
refused with the reason.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ._names import did_you_mean
from .errors import ConfigurationError
from .stores._log import get_logger

if TYPE_CHECKING:
    from .job import UniqueJob

__all__ = ["KEPT", "PER_CALL", "REFUSED", "origin", "using"]

J = TypeVar("J", bound="type[UniqueJob]")

#: The settings one call may give, by the name it gives them (the class attribute without
#: ``unique_``): each is applied by the caller's side (the enqueue, or an inline run).
PER_CALL: dict[str, str] = {
    "on_conflict": "unique_on_conflict",
    "lock_autoexpire": "unique_lock_autoexpire",
    "reschedule_delay": "unique_reschedule_delay",
}

_WORKER = "the worker reads it from the job class"
_KEY = "every call of the class, the worker, is_locked() and `uniqjob release` must derive one key for a call"
_SHARED = "it is shared by every call of the key"

#: The settings that cannot be given for one call, and why.
REFUSED: dict[str, str] = {
    "strategy": f"it decides what the worker holds while the job runs, and {_WORKER}",
    "run_lease": f"the run lock is renewed by the worker that runs the job, and {_WORKER}",
    "on_lost": f"it is called in the worker that holds the run lock, and {_WORKER}",
    "args": f"it makes the key, and {_KEY}",
    "key": f"it makes the key, and {_KEY}",
    "once_per": f"it makes the key (one per tick), and {_KEY}",
    "debounce": f"the worker delays a job that is not yet due again, and {_WORKER}",
    "debounce_max_wait": f"the worker delays a job that is not yet due again, and {_WORKER}",
    "lock_limit": _SHARED,
    "backend": "the worker finds the lock in the class's store",
    "queue": "the class's queue holds its jobs and proves them gone: a job pushed elsewhere would look gone",
    "concurrency_limit": _SHARED,
    "concurrency_duration": _SHARED,
    "concurrency_on_conflict": _SHARED,
    "concurrency_wait_timeout": _SHARED,
    "concurrency_key": _SHARED,
}

#: How many per-call classes are kept, the most recently used first.
KEPT = 256

_settings_log = get_logger("uniqjob.settings")

_Items = tuple[tuple[str, str, Any], ...]
_made: OrderedDict[tuple[type[UniqueJob], _Items], type[UniqueJob]] = OrderedDict()  # the kept classes
_mutex = threading.Lock()


def origin(job: type[UniqueJob]) -> type[UniqueJob]:
    """The job class that ``job`` was made from by :func:`using` (``job`` itself if it was not)."""
    made_from: type[UniqueJob] | None = vars(job).get("_percall_origin")
    return job if made_from is None else made_from


def using(job: J, settings: Mapping[str, Any], *, prefix: str = "", where: str = "") -> J:
    """Return ``job`` with ``settings`` (names without ``unique_``, unless given as ``prefix``) for one call.

    ``where`` names the call in an error (default ``Job.using()``). No settings: ``job`` itself.
    """
    if not settings:
        return job
    base = origin(job)
    where = where or f"{base.__qualname__}.using()"
    given: dict[str, Any] = dict(vars(job).get("_percall_settings", {}))
    for name, value in settings.items():
        given[_setting_name(name, prefix, where)] = value
    items = tuple(sorted((name, type(value).__name__, value) for name, value in given.items()))
    try:
        hash(items)
    except TypeError:  # an unhashable value: never a valid one, and the check below says why
        return _make(base, items, where, prefix)  # type: ignore[return-value]
    key = (base, items)
    with _mutex:
        made = _made.get(key)
        if made is not None:
            _made.move_to_end(key)
            return made  # type: ignore[return-value]
    made = _make(base, items, where, prefix)
    with _mutex:
        made = _made.setdefault(key, made)  # a racing thread's, if it was first: one class per settings
        while len(_made) > KEPT:
            _made.popitem(last=False)
    return made  # type: ignore[return-value]


def _setting_name(name: str, prefix: str, where: str) -> str:
    """The per-call name of ``name`` as given (``prefix`` stripped); ConfigurationError if it is none."""
    bare = name.removeprefix(prefix) if prefix and name.startswith(prefix) else name
    if bare in PER_CALL:
        return bare
    shown = [f"{prefix}{n}" for n in PER_CALL]
    if bare in REFUSED:
        raise ConfigurationError(
            f"{where}: {name} cannot be given for one call: {REFUSED[bare]}; set it on the class"
            f" (per-call settings: {', '.join(shown)})"
        )
    known = [f"{prefix}{n}" for n in (*PER_CALL, *REFUSED)]
    hint = did_you_mean(name, known)
    raise ConfigurationError(
        f"{where}: {name!r} is not a uniqjob setting ({hint}per-call settings: {', '.join(shown)})"
    )


def _make(base: type[UniqueJob], items: _Items, where: str, prefix: str) -> type[UniqueJob]:
    given = {name: value for name, _, value in items}
    namespace: dict[str, Any] = {PER_CALL[name]: value for name, value in given.items()}
    namespace.update(
        __module__=base.__module__,
        __qualname__=base.__qualname__,
        __doc__=base.__doc__,
        _percall_origin=base,
        _percall_settings=given,
    )
    # The class logged its definition-time warnings when it was defined: not again for each per-call
    # class. Only a per-call lock_autoexpire can change what they say (None where the class has seconds).
    quiet = _Quiet() if "lock_autoexpire" not in given or base.unique_lock_autoexpire is None else None
    if quiet is not None:
        _settings_log.addFilter(quiet)
    try:
        made: type[UniqueJob] = type(base.__name__, (base,), namespace)
    except ConfigurationError as exc:
        shown = ", ".join(f"{prefix}{name}={value!r}" for name, value in given.items())
        raise ConfigurationError(f"{where} ({shown}): {exc}") from None
    finally:
        if quiet is not None:
            _settings_log.removeFilter(quiet)
    return made


class _Quiet(logging.Filter):  # one per class made: another thread's may be removed meanwhile
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING
