"""The exception hierarchy of uniqjob.

This module imports nothing else of the package, so every other module (and a
worker that only needs to unpickle an error) can import it cheaply.

Every exception keeps its facts as attributes, builds a useful ``str()`` and
pickles: workers send exceptions across process boundaries, and the default
``Exception.__reduce__`` would call ``__init__`` with the message alone.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

__all__ = [
    "BackendError",
    "ConcurrencyLimitExceeded",
    "ConfigurationError",
    "CorruptRecordError",
    "JobNotUnique",
    "StoreRefusedURLError",
    "UniqJobError",
    "UniqueKeyError",
    "UnstorableCallError",
    "holder_text",
]


def holder_text(facts: Mapping[str, Any]) -> str:
    """A key holder's facts (``LockState.describe()``) as a phrase: ``running as pid 42 on web-1 for 3.100s``.

    Durations carry their unit; facts without a phrase of their own follow as ``name=value``.
    """
    facts = {k: v for k, v in facts.items() if v not in (None, "")}
    if not facts:
        return ""
    text = str(facts.pop("state", "held"))
    if "host" in facts or "pid" in facts:
        text += f" as pid {facts.pop('pid', '?')} on {facts.pop('host', '?')}"
    if "running_for" in facts:
        text += f" for {_secs(facts.pop('running_for'))}"
    if "since" in facts:
        text += f", taken {_secs(facts.pop('since'))} ago"
    if "job_id" in facts:
        text += f", job id {facts.pop('job_id')}"
    if "clears_in" in facts:
        text += f", clears in {_clears(facts.pop('clears_in'), facts.pop('clears_by', ''))}"
    facts.pop("clears_by", None)
    return ", ".join([text, *(f"{k}={v}" for k, v in facts.items())])


def _clears(seconds: object, by: object) -> str:
    """``12.3s (autoexpire)``; a lease is renewed while its holder lives, and the phrase says so."""
    text = _secs(seconds, 1)
    if by == "lease":
        return f"{text} (lease, unless its holder renews it)"
    return f"{text} ({by})" if by else text


def _secs(value: object, digits: int = 3) -> str:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return f"{value:.{digits}f}s" if number else f"{value}s"


class UniqJobError(Exception):
    """Base class of every error raised by uniqjob."""


class JobNotUnique(UniqJobError):
    """The lock key is already held: the job is queued or running elsewhere.

    ``holder`` holds the holder's facts (``LockState.describe()``); among them
    ``clears_in``, the seconds until the locks that refused the call end as the
    store recorded them (autoexpire and/or the run lock's lease, whichever ends
    them, named by ``clears_by``), or None when nothing ends them but their holder.
    """

    def __init__(self, key: str, holder: Mapping[str, Any] | None = None) -> None:
        self.key = key
        self.holder: dict[str, Any] = dict(holder or {})
        super().__init__(self._message())

    def _message(self) -> str:
        facts = holder_text(self.holder)
        return f"job {self.key!r} is already locked" + (f" ({facts})" if facts else "")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.holder))


class _ArgumentError(UniqJobError, TypeError):
    """An argument of a call is refused: ``path`` names it, e.g. ``payload["user"]``."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}" if path else reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.reason))


class UniqueKeyError(_ArgumentError):
    """A lock key cannot be derived from the job's arguments (``path`` names the offending one)."""


class ConfigurationError(UniqJobError, ValueError):
    """A job class setting, URL or backend option is invalid."""


class BackendError(UniqJobError):
    """The lock store failed or could not be reached; the job was not run."""

    def __init__(self, message: str, backend: str = "") -> None:
        self.backend = backend
        super().__init__(f"{backend}: {message}" if backend else message)
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.backend))


class StoreRefusedURLError(BackendError, ConfigurationError):
    """The store's answer is the URL's mistake: a password needed or refused, no such database.

    A :class:`BackendError` (the call failed at the store) and a
    :class:`ConfigurationError` (the fix is in the URL); the command line exits 78.
    """


class CorruptRecordError(BackendError):
    """A lock record cannot be read; it is never treated as a free lock.

    ``path`` names where the record lives (a file, or a Redis key), ``key`` the
    lock key when it can be told ("" when the record is too damaged to say).
    The key stays blocked until the record is removed, and the message says how.
    """

    def __init__(self, path: str, reason: str, *, key: str = "", backend: str = "file") -> None:
        self.path = path
        self.reason = reason
        self.key = key
        what = f"lock record {path}" + (f" of key {key!r}" if key else "")
        fix = shlex.quote(key or path)
        fix = f"it blocks its key until removed with: uniqjob release --force {fix}"
        super().__init__(f"unreadable {what}: {reason}; {fix}", backend)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_corrupt, (self.path, self.reason, self.key, self.backend))


def _corrupt(path: str, reason: str, key: str, backend: str) -> CorruptRecordError:
    return CorruptRecordError(path, reason, key=key, backend=backend)


class ConcurrencyLimitExceeded(UniqJobError):
    """A concurrency key is at its limit (policy "raise"), or a blocked inline wait timed out."""

    def __init__(self, key: str, limit: int, waited: float | None = None) -> None:
        self.key = key
        self.limit = limit
        self.waited = waited
        message = f"concurrency key {key!r} is at its limit of {limit}"
        if waited is not None:
            message += f" (gave up after waiting {waited:.1f}s)"
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.limit, self.waited))


class UnstorableCallError(_ArgumentError):
    """A call that may be parked has an argument (or a class) that cannot be stored as data.

    ``path`` names the offending argument, e.g. ``kwargs["conn"]``.
    """
