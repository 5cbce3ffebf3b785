"""Queue integrations: one module per framework, and what they share.

``uniqjob.integrations.rq`` (``pip install uniqjob[rq]``) and
``uniqjob.integrations.celery`` (``pip install uniqjob[celery]``) import their
framework; this module and the core never do.

What they share is the worker side: a job carries a :class:`Ticket` (its lock
key and token, and for RQ the job class), the worker rebuilds the lock from it
and runs the job with :func:`perform`, which keeps the lock (and a concurrency
slot) while the queue still means to run the job again (a retry) and releases
it otherwise. A second delivery of a job while the first still runs (an
at-least-once broker) is refused by the backend in the same step that would
let it start (:meth:`Backend.start <uniqjob.stores.base.Backend.start>`
tells deliveries of one token apart).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, TypeVar

from .. import _job_async, _job_sync
from .._refs import job_ref, resolve_job
from ..concurrency import _job as _concurrency
from ..errors import ConfigurationError
from ..job import UniqueJob
from ..joblock import JobLock
from ..stores.aio import async_backend

__all__ = [
    "HEADER",
    "KEEP",
    "SETTING_PREFIXES",
    "Decide",
    "Decision",
    "Ticket",
    "aperform",
    "in_context",
    "job_ref",
    "perform",
    "release_gone",
    "resolve_job",
    "settle",
]

#: The name under which lock data travels with a job (RQ job meta, Celery message header).
HEADER = "uniqjob"

#: How the names of uniqjob's settings start, as task, actor and backend options.
SETTING_PREFIXES: Final = ("unique_", "concurrency_")

#: A decision that the lock was already settled (kept for a retry) while the job ran.
KEEP: Final = "keep"

#: What the end of one delivery means for its lock: None, the job is done for
#: good (release); a number, the queue runs it again in that many seconds
#: (keep it, queued); KEEP, already taken care of.
Decision = float | None | Literal["keep"]

#: Given how one delivery ended (its exception, or its result), the decision.
Decide = Callable[[BaseException | None, Any], Decision]

T = TypeVar("T")


@contextmanager
def in_context(var: ContextVar[T], value: T) -> Iterator[None]:
    """``var`` set to ``value`` for the block (the call being enqueued, the task being run), reset after."""
    reset = var.set(value)
    try:
        yield
    finally:
        var.reset(reset)


@dataclass(frozen=True, slots=True)
class Ticket:
    """The lock data that travels with a job: its key, its token and (for RQ) its job class."""

    key: str
    token: str
    job: str = ""  # "module:QualName" of the job class, where the queue does not know it

    def dump(self) -> dict[str, str]:
        """Return the ticket as a plain dict that any serializer (JSON, pickle) carries."""
        data = {"key": self.key, "token": self.token}
        if self.job:
            data["job"] = self.job
        return data

    @classmethod
    def load(cls, data: object, where: str) -> Ticket:
        """Read a ticket back; a missing or malformed one is a ConfigurationError naming ``where``."""
        if not isinstance(data, Mapping):
            raise ConfigurationError(
                f"{where} carries no uniqjob lock data: enqueue it through its job class"
                " (MyJob.enqueue() / task.delay()), not with the queue's own API"
            )
        key, token, job = data.get("key"), data.get("token"), data.get("job")
        job = "" if job is None else job
        if not (isinstance(key, str) and key and isinstance(token, str) and token and isinstance(job, str)):
            raise ConfigurationError(f"{where} carries malformed uniqjob lock data: {dict(data)!r}")
        return cls(key, token, job)

    def lock(self, job_cls: type[UniqueJob], job_id: str = "") -> JobLock:
        """The lock the ticket names, rebuilt for ``job_cls`` (worker side), recording its job's id."""
        lock = job_cls.lock_from(self.key, self.token)
        lock.meta = replace(lock.meta, job_id=job_id)
        return lock


def perform(
    job_cls: type[UniqueJob],
    lock: JobLock,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    decide: Decide,
) -> Any:
    """Run one delivery of a job under its lock; return its result.

    The lock is released when the delivery ends, unless ``decide`` says that
    the queue will run the job again: then it stays held, ``queued``, for the
    retry, and so does the job's concurrency slot, if it holds one.
    """
    return job_cls.execute(lock, args, kwargs, settle=lambda exc, result: settle(lock, decide(exc, result)))


async def aperform(
    job_cls: type[UniqueJob],
    lock: JobLock,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    decide: Decide,
) -> Any:
    """:func:`perform`, awaited (an async worker's side: arq)."""

    def settle_async(exc: BaseException | None, result: Any) -> Awaitable[None]:
        return _job_async.settle(lock, async_backend(lock.backend), decide(exc, result))

    return await job_cls.aexecute(lock, args, kwargs, settle=settle_async)


def settle(lock: JobLock, decision: Decision) -> None:
    """Release the lock (None: the job is done for good), or keep it queued for a retry in n seconds.

    A concurrency slot goes the same way: released as the delivery ends, or
    kept, reserved, for the retry (whose token is the same). Call this before
    the retry is sent, so that the retry never finds either still running.
    """
    _job_sync.settle(lock, lock.backend, decision)


def release_gone(
    job_cls: type[UniqueJob], lock: JobLock, args: Sequence[Any], kwargs: dict[str, Any]
) -> None:
    """Free what a job the queue will never run holds (revoked, expired, dead-lettered, skipped).

    Its lock goes, and the "keep_last" call that waited behind it is pushed; its
    concurrency slot, found by the concurrency key of ``args`` and ``kwargs`` (as
    on a worker that runs it), goes too, and the oldest parked call takes it.
    """
    lock.release()
    _job_sync.next_call(job_cls, lock, lock.backend)
    _concurrency.free(job_cls, lock.token, tuple(args), dict(kwargs))
