"""The names a job class defines, checked when it is defined: clashes and near misses.

Three mistakes pass a class definition silently and fail much later, or never:

- **A clash with the mixin's own names.** ``def run(self, x)`` replaces the
  classmethod ``UniqueJob.run``; ``backend = "s3"`` replaces the classmethod
  that returns the class's store. Rule: a name the mixin defines as a method
  (``run``, ``enqueue``, ``lock``, ``backend``, ...) may be overridden only by
  the same kind of method (a classmethod by a classmethod); ``perform``, the
  job's own work, may be anything. Names starting with ``_`` are not checked.
- **A near miss of a setting.** ``concurency_limit = 3``, ``uniq_on_conflict =
  "raise"`` or ``lock_autoexpire = 60`` would be ignored. Rule: a class
  attribute of the class's own body, not starting with ``_``, whose value is
  not a function (or a classmethod, staticmethod or property), is refused when
  its name, lowercased, is within :data:`NEAR` (difflib's ratio) of a setting's
  name or of a ``unique_*`` setting's name without its prefix, where that rest
  has two words or more (``lock_autoexpire``, ``on_conflict``, ``run_lease``,
  ...; single words such as ``args``, ``key`` or ``queue`` are a job's own
  business). A name starting ``unique_`` or ``concurrency_`` that is no setting
  is refused however far it is from one.
- **A misspelt hook.** ``def preform(self)`` leaves the class without a
  ``perform``. Rule: when no class below the mixin in the MRO defines a hook
  (``perform``, ``unique_key``, ``concurrency_key``), a function in the class's
  own body whose name (underscores at either end stripped) is within
  :data:`NEAR_HOOK` of the hook's is refused. (A class with no ``perform`` at
  all is refused by :class:`~uniqjob.job.UniqueJob` itself, unless it is
  declared ``abstract=True``: a base class of jobs.)

Each refusal is a :class:`ConfigurationError` naming the clash and, where one
is close, the name meant (:func:`suggest`, which ``@unique`` uses for its
options too).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable
from typing import Any

from .errors import ConfigurationError
from .settings import SETTINGS as ALL_SETTINGS

__all__ = ["ALL_SETTINGS", "HOOKS", "NEAR", "NEAR_HOOK", "check", "did_you_mean", "suggest"]

#: How close (difflib's ratio, 0 to 1) a plain attribute's name must be to a setting's to be a typo of it.
NEAR = 0.88
#: How close a function's name must be to a missing hook's (``preform`` is 0.86 from ``perform``).
NEAR_HOOK = 0.8

#: The methods a job class is meant to override, each with whatever it likes.
HOOKS = ("perform", "unique_key", "concurrency_key")

# What each spelling a near miss is measured against stands for: the settings, and the
# unique_* ones without their prefix when that rest is two words or more.
_FORMS: dict[str, str] = {name: name for name in ALL_SETTINGS} | {
    name.removeprefix("unique_"): name for name in ALL_SETTINGS if "_" in name.removeprefix("unique_")
}


def suggest(name: str, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The one of ``known`` closest to ``name`` (difflib's ratio at least ``cutoff``), or None."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def did_you_mean(name: str, known: Iterable[str], cutoff: float = 0.6) -> str:
    """``"did you mean 'x'? "`` for the closest of ``known``, or "" when none is close."""
    close = suggest(name, known, cutoff)
    return f"did you mean {close!r}? " if close else ""


def check(cls: type, base: type) -> None:
    """Raise :class:`ConfigurationError` naming the first clash or near miss in ``cls``'s own body."""
    name = cls.__qualname__
    own = vars(cls)
    for attr, value in own.items():
        if attr.startswith("_"):
            continue
        _check_clash(name, attr, value, base)
        if attr.startswith(("unique_", "concurrency_")) and attr not in ALL_SETTINGS:
            meant = suggest(attr, ALL_SETTINGS)
            hint = f": did you mean {meant!r}?" if meant else ""
            raise ConfigurationError(
                f"{name}.{attr} is not a uniqjob setting{hint} (known: {', '.join(sorted(ALL_SETTINGS))})"
            )
        if attr not in ALL_SETTINGS and attr not in vars(base) and not _is_function(value):
            meant = suggest(attr.lower(), _FORMS, NEAR)
            if meant is not None:
                raise ConfigurationError(
                    f"{name}.{attr} is not a uniqjob setting: did you mean {_FORMS[meant]!r}? (a job's own"
                    " attribute of that name would be ignored by uniqjob; start it with '_' if it is yours)"
                )
    for hook in HOOKS:
        if _defined_below(cls, base, hook):
            continue
        for attr, value in own.items():
            if _is_function(value) and suggest(attr.strip("_").lower(), [hook], NEAR_HOOK):
                raise ConfigurationError(f"{name} defines {attr}() but no {hook}(): did you mean {hook}?")


def _check_clash(name: str, attr: str, value: object, base: type) -> None:
    """Refuse ``attr`` replacing a method of the mixin ``base`` with something of another kind."""
    if attr in HOOKS or attr not in vars(base):
        return
    mine = inspect.getattr_static(base, attr)
    if not _is_function(mine) or type(value) is type(mine):
        return
    kind = "a classmethod" if isinstance(mine, classmethod) else f"a {type(mine).__name__}"
    setting = f"unique_{attr}"
    if setting in ALL_SETTINGS and not _is_function(value):
        fix = f"did you mean {setting} = {value!r}?"
    else:
        fix = f"rename it, or define it as {kind} to override it on purpose"
    raise ConfigurationError(
        f"{name}.{attr} replaces the mixin's own {base.__name__}.{attr}() ({kind}) with {_what(value)}: {fix}"
    )


def _defined_below(cls: type, base: type, attr: str) -> bool:
    """True if a class between ``cls`` and ``base`` (``cls`` included) in the MRO defines ``attr``."""
    for klass in cls.__mro__:
        if klass is base:
            return False
        if attr in vars(klass):
            return True
    return False


def _is_function(value: Any) -> bool:
    return isinstance(value, (classmethod, staticmethod, property)) or inspect.isroutine(value)


def _what(value: object) -> str:
    if inspect.isfunction(value):
        return "an instance method"
    if isinstance(value, (staticmethod, property)):
        return f"a {type(value).__name__}"
    return f"the {type(value).__name__} {value!r}"
