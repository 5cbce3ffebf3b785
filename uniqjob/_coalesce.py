"""Coalescing conflict policies, without I/O: "keep_last" and "replace" (README, docs/strategies.md).

The store makes each decision in the claim (:meth:`~uniqjob.stores.base.Backend.claim`'s
``coalesce``): a "keep_last" duplicate's arguments replace the queued call's, or become
the pending call behind a running one; a "replace" duplicate takes a queued call's
place. Here: a call's arguments as the JSON the store keeps, the :class:`Pending`
marker, and what a coalesced duplicate returns.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._job_base import log
from .errors import ConfigurationError
from .locks import PendingCall, QueueMeta

if TYPE_CHECKING:
    from .job import UniqueJob
    from .joblock import JobLock
    from .stores.base import Coalesce

__all__ = ["Pending", "conflict", "decode", "encode", "follower", "hand_on", "json_ref", "mode", "push_of"]


class Pending:
    """What a "keep_last" call returns while it waits behind the running call of its key.

    It is pushed to the queue, with the latest arguments, as soon as that run ends
    (``job_id``: the id its job will have; "" if the queue gives none).
    """

    __slots__ = ("job_id", "key")

    def __init__(self, key: str, job_id: str = "") -> None:
        self.key = key
        self.job_id = job_id

    def __repr__(self) -> str:
        return f"Pending(key={self.key!r}, job_id={self.job_id!r})"


def mode(cls: type[UniqueJob]) -> Coalesce:
    """What ``cls``'s claims ask the store to coalesce ("": nothing); a debounced class keeps the last."""
    policy = cls.unique_on_conflict
    if cls.unique_debounce is not None:
        return "keep_last"
    return policy if policy in ("keep_last", "replace") else ""


def encode(cls: type[UniqueJob], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A call's arguments as the JSON the lock store keeps for "keep_last"; ConfigurationError if they
    are not JSON (strings, numbers, booleans, None, lists and dicts with string keys)."""
    named: list[tuple[int | str, Any]] = [*enumerate(args, 1), *kwargs.items()]
    for name, value in named:
        if type(value) not in _SCALARS and not _kept_as_is(value):
            raise ConfigurationError(
                f"{cls.job_name()}: unique_on_conflict 'keep_last' keeps the latest call's arguments in"
                f" the lock store as JSON, which would change argument {_named(name)} ({value!r}): a"
                " tuple would come back a list, a dict key that is not a string a string; pass lists"
                " and dicts with string keys"
            )
    call: dict[str, Any] = {"a": list(args), "k": kwargs}
    if cls.unique_queue is not None:  # whoever reclaims a dead holder's key pushes its pending call
        call["j"] = f"{cls.__module__}:{cls.__qualname__}"
    try:
        return _encoder().encode(call)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"{cls.job_name()}: unique_on_conflict 'keep_last' keeps the latest call's arguments in the"
            f" lock store as JSON, and these are not JSON ({exc}): pass plain values (ids, not objects)"
        ) from None


def _named(name: int | str) -> str:
    """An argument for a message: ``#1`` for the first positional one, a keyword's own name."""
    return f"#{name}" if isinstance(name, int) else name


#: The types JSON writes and reads back as they are (the common case: checked without a call).
_SCALARS = frozenset({str, int, float, bool, type(None)})


@functools.cache
def _encoder() -> json.JSONEncoder:
    """One encoder for every call: ``json.dumps`` with options builds a new one each time."""
    return json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _kept_as_is(value: Any) -> bool:
    """Whether JSON gives ``value`` back as it is (no tuple, no dict key but strings, in all its depth)."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _kept_as_is(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_kept_as_is(v) for v in value)
    return not isinstance(value, tuple)  # (what JSON cannot write at all, json.dumps refuses)


def decode(text: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments :func:`encode` made ``text`` of."""
    call = json.loads(text)
    return tuple(call["a"]), dict(call["k"])


def conflict(cls: type[UniqueJob], lock: JobLock) -> Any:
    """What a coalesced duplicate returns: the handle of the queued job that will run with its
    arguments, a :class:`Pending` marker, or None (dropped and logged, as policy "log")."""
    state = lock.conflict
    how = state.coalesced if state is not None else ""
    queue = cls.unique_queue
    if how == "latest" and state is not None and state.queue is not None:
        job_id = state.queue.meta.job_id
        log.info("%s coalesced: %s runs queued job %s with its arguments", cls.job_name(), lock.key, job_id)
        return queue.handle(job_id) if queue is not None and job_id else None
    if how == "pending":
        log.info("%s pending: %s runs again when its running call ends", cls.job_name(), lock.key)
        return Pending(lock.key, lock.meta.job_id)
    if log.isEnabledFor(logging.INFO):
        facts = state.describe() if state is not None else {}
        log.info("%s dropped: %s is already locked (%s)", cls.job_name(), lock.key, facts)
    return None


def follower(cls: type[UniqueJob], key: str, pending: PendingCall) -> JobLock:
    """The lock of ``pending``, the call that waited behind ``key``'s run, now its queued lock."""
    lock = cls.lock_from(key, pending.token)
    lock.meta = QueueMeta(lock.meta.cls, pending.meta.args, pending.meta.job_id)
    return lock


def json_ref(text: str) -> str:
    """The job class reference (``module:QualName``) in a call's JSON, "" if it has none."""
    return str(json.loads(text).get("j", ""))


def hand_on(cls: type[UniqueJob], key: str, pending: PendingCall) -> bool:
    """Push ``pending``, the call of ``cls`` that waited behind ``key``'s run and that its release
    queued, as the holder would have; False if ``cls`` has no queue (the caller drops the call).

    An async queue's push (arq's) is awaited to its end on the library's background event loop.
    """
    from .concurrency._semaphore_base import push_call  # here: only a key with a pending call needs it

    if cls.unique_queue is None:
        return False
    args, kwargs = decode(pending.meta.call)
    push_call(push_of(cls, follower(cls, key, pending), args, kwargs))
    return True


def push_of(
    cls: type[UniqueJob], lock: JobLock, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[[], Any]:
    """The push of ``lock``'s call to ``cls``'s queue, to make: a debounced one is due a debounce from
    now (a burst that came while the last call ran), any other at once."""
    queue = cls.unique_queue
    assert queue is not None
    if lock.debounce is None:
        return functools.partial(queue.push, cls, lock, args, kwargs)
    return functools.partial(queue.push_in, cls, lock, args, kwargs, lock.debounce[0])
