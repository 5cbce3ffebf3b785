"""RQ integration: unique jobs on RQ queues, run by a plain ``rq worker``; docs/rq.md has the rules.

::

    class SendReport(UniqueJob):
        unique_queue = RQQueue(Queue("reports", connection=Redis()), retry=Retry(max=3))

        def perform(self, account_id: int) -> None: ...

    SendReport.enqueue(42)   # takes the lock, then enqueues into RQ; None for a duplicate
    enqueue_call(SendReport, args=(42,), timeout=600, job_id="report-42")  # RQ options for one job

RQ runs :func:`run_job`, which reads the lock's key and token from the job's
meta (never recomputed from arguments RQ may have transformed) and keeps the
lock, queued, while RQ still means to retry the job. The queue lock records
the RQ job id, so a later enqueue reclaims a lock whose job RQ no longer has
(:meth:`RQQueue.job_gone`).
"""

from __future__ import annotations

import contextlib
import math
import threading
import uuid
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import redis

try:
    from rq import Queue as RQ
    from rq import Retry, get_current_job
    from rq.exceptions import InvalidJobOperation, NoSuchJobError
    from rq.job import Job
except ModuleNotFoundError as exc:  # the optional extra
    raise ModuleNotFoundError(
        f"uniqjob.integrations.rq needs rq ({exc.name} is missing): pip install 'uniqjob[rq]'", name=exc.name
    ) from exc

from .. import _percall
from ..errors import ConfigurationError
from ..job import Queue, UniqueJob
from ..joblock import JobLock
from ..stores._log import get_logger
from . import HEADER, Ticket, in_context, job_ref, perform, resolve_job

__all__ = ["RQQueue", "enqueue_again", "enqueue_call", "run_job"]

log = get_logger(__name__)

#: Options of RQ's ``enqueue_call`` that every job of an RQQueue gets. Left out on
#: purpose: ``depends_on`` (a job stuck behind a failed dependency is not provably
#: gone, so its lock would wait for autoexpire) and ``repeat`` (a repeated run
#: would come back after its lock was released).
OPTIONS = frozenset({
    "timeout", "result_ttl", "ttl", "failure_ttl", "retry", "at_front",
    "on_success", "on_failure", "on_stopped",
})  # fmt: skip

#: What :func:`enqueue_call` takes besides :data:`OPTIONS`: the RQ job id of this one job.
CALL_OPTIONS = OPTIONS | {"job_id"}

#: Seconds a queued lock is held before a conflicting enqueue asks RQ whether its job is gone
#: (docs/rq.md, "Cost, and is the holder's job gone?"): far longer than a push takes.
SUSPECT_AFTER = 60.0

# Statuses after which RQ never runs a job again without someone requeuing it by hand.
_GONE = frozenset({"finished", "failed", "stopped", "canceled"})

# RQ 2.1+ runs a job again when it returns a Retry (and added Retry.get_interval with it).
_RETURNED_RETRY = hasattr(Retry, "get_interval")


@dataclass
class _Call:
    """One call of a job class, in the context of its :func:`enqueue_call` or :func:`enqueue_again`."""

    job: type[UniqueJob]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    used: bool = False  # its push happened: any later push in the context is another call's
    again: bool = False  # enqueue_again's call: rescheduled again, it runs its own job again
    again_in: float | None = None  # ... in this many seconds

    def matches(self, job_cls: type[UniqueJob], args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
        """True if this is the call being pushed (not, say, a parked call promoted meanwhile)."""
        return not self.used and job_cls is self.job and tuple(args) == self.args and kwargs == self.kwargs


_calls: ContextVar[_Call | None] = ContextVar("uniqjob_rq_call", default=None)


def _check_options(options: dict[str, Any], known: frozenset[str], where: str) -> None:
    """ConfigurationError for an option RQ jobs of an RQQueue do not take, or a malformed one."""
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigurationError(
            f"{where} does not take {', '.join(unknown)} (it takes: {', '.join(sorted(known))})"
        )
    retry = options.get("retry")
    if retry is not None and not isinstance(retry, Retry):
        raise ConfigurationError(f"{where} retry must be an rq.Retry, got {retry!r}")
    job_id = options.get("job_id")
    if job_id is not None and not (isinstance(job_id, str) and job_id):
        raise ConfigurationError(f"{where} job_id must be a non-empty string, got {job_id!r}")


class RQQueue(Queue):
    """An RQ queue as a job class's ``unique_queue``.

    ``queue`` is an ``rq.Queue``, or a function returning one (called once, on
    first use, for apps that connect to Redis at startup). ``options`` are RQ
    job options (:data:`OPTIONS`) given to every job, e.g. ``retry=Retry(max=3)``
    or ``timeout=600``.
    """

    def __init__(self, queue: RQ | Callable[[], RQ], **options: Any) -> None:
        _check_options(options, OPTIONS, "RQQueue")
        if not (isinstance(queue, RQ) or callable(queue)):
            raise ConfigurationError(f"RQQueue needs an rq.Queue or a function returning one, got {queue!r}")
        self.options = options
        self._source = queue
        self._queue = queue if isinstance(queue, RQ) else None
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        name = self._queue.name if self._queue is not None else "(not connected yet)"
        return f"RQQueue({name!r})"

    @property
    def queue(self) -> RQ:
        """The ``rq.Queue`` jobs go to."""
        if self._queue is None:
            with self._mutex:
                if self._queue is None:
                    assert not isinstance(self._source, RQ)
                    made = self._source()
                    if not isinstance(made, RQ):
                        raise ConfigurationError(f"the RQQueue factory returned {made!r}, not an rq.Queue")
                    self._queue = made
        return self._queue

    #: See :attr:`uniqjob.queues.Queue.suspect_after`, and docs/rq.md.
    suspect_after: float | None = SUSPECT_AFTER

    def new_job_id(self) -> str:
        """The RQ job id of the job about to be enqueued, recorded in its queue lock by the claim:
        the ``job_id`` given to :func:`enqueue_call`, else a fresh one."""
        call = _calls.get()
        if call is not None and not call.used and call.options.get("job_id"):
            return str(call.options["job_id"])
        return str(uuid.uuid4())

    def push(
        self,
        job_cls: type[UniqueJob],
        lock: JobLock,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        delay: float | None = None,
    ) -> Job:
        """Enqueue the job into RQ, with its lock's key and token in the job's meta (``delay``: see push_in).

        Inside :func:`enqueue_call`, that call's options override the queue's
        (a ``job_id`` given there is the lock's job id already: :meth:`new_job_id`).
        """
        ticket = Ticket(lock.key, lock.token, job_ref(job_cls))
        options = dict(self.options)
        call = _calls.get()
        if call is not None and call.matches(job_cls, args, kwargs):
            call.used = True
            options.update(call.options)
            options.pop("job_id", None)
        at_front = bool(options.pop("at_front", False))
        job = {"job_id": lock.meta.job_id or None, "meta": {HEADER: ticket.dump()}, **options}
        job["description"] = f"{job_cls.job_name()}({lock.meta.args})"
        if delay is not None:  # RQ's scheduler enqueues it then (rq worker --with-scheduler)
            return self.queue.enqueue_in(timedelta(seconds=delay), run_job, args=args, kwargs=kwargs, **job)
        return self.queue.enqueue_call(run_job, args=args, kwargs=kwargs, at_front=at_front, **job)

    #: :meth:`push`, the job scheduled to start in ``delay`` seconds (``unique_debounce``).
    push_in = push

    def push_later(
        self, job_cls: type[UniqueJob], args: tuple[Any, ...], kwargs: dict[str, Any], delay: float
    ) -> Job | None:
        """Have a worker call ``job_cls.enqueue(*args, **kwargs)`` in ``delay`` seconds (RQ's scheduler).

        The scheduler runs inside workers started with ``rq worker --with-scheduler``.
        A call that :func:`enqueue_again` is trying again and finds still locked
        gets no second job: that job itself runs again in ``delay`` seconds (RQ
        2.1+), so a duplicate costs one delayed job, however long the first runs.
        Its result is not kept (``result_ttl=0``).
        """
        again = _calls.get()
        if _RETURNED_RETRY and again is not None and again.again and again.matches(job_cls, args, kwargs):
            again.again_in = delay
            return get_current_job()
        call = (job_ref(job_cls), list(args), dict(kwargs))
        description = f"uniqjob: enqueue {job_cls.job_name()} again"
        if delay <= 0:
            return self.queue.enqueue_call(enqueue_again, args=call, description=description, result_ttl=0)
        return self.queue.enqueue_in(
            timedelta(seconds=delay), enqueue_again, args=call, description=description, result_ttl=0
        )

    def handle(self, job_id: str) -> Job:
        """The ``rq.job.Job`` of ``job_id`` on this queue's connection, made without a round trip
        (policy "use_existing": ``return_value()`` and ``get_status()`` read it when asked)."""
        queue = self.queue
        return queue.job_class(job_id, connection=queue.connection, serializer=queue.serializer)

    def remove(self, job_id: str) -> None:
        """Cancel RQ job ``job_id`` (policy "replace"), unless it is gone or no longer cancellable."""
        queue = self.queue
        with contextlib.suppress(NoSuchJobError, InvalidJobOperation):  # gone, or ended: its start is refused
            queue.job_class.fetch(job_id, connection=queue.connection, serializer=queue.serializer).cancel()

    def job_gone(self, job_id: str) -> bool:
        """True if RQ no longer has job ``job_id``, or has it finished, failed, stopped or cancelled."""
        queue = self.queue
        pipe = queue.connection.pipeline(transaction=False)
        key = queue.job_class.key_for(job_id)
        pipe.exists(key)
        pipe.hget(key, "status")
        try:
            exists, status = pipe.execute()
        except redis.RedisError:
            log.warning("cannot tell whether RQ job %s is gone; keeping its lock", job_id, exc_info=True)
            return False
        if not exists:
            return True  # deleted, emptied with its queue, or expired (job ttl)
        if isinstance(status, bytes):
            status = status.decode()
        return status in _GONE


def run_job(*args: Any, **kwargs: Any) -> Any:
    """What RQ workers run for a job of an :class:`RQQueue`: perform it under the lock in its meta."""
    job = get_current_job()
    if job is None:
        raise ConfigurationError("uniqjob.integrations.rq.run_job runs inside an RQ worker, not directly")
    ticket = Ticket.load(job.meta.get(HEADER), f"RQ job {job.id}")
    job_cls = resolve_job(ticket.job)
    lock = ticket.lock(job_cls, job.id)
    return perform(job_cls, lock, args, kwargs, lambda exc, result: retry_delay(job, exc, result))


def enqueue_call(
    job_cls: type[UniqueJob],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """``job_cls.enqueue(*args, **kwargs)`` with RQ options for this one job; returns what enqueue returns.

    ``options`` are those of :class:`RQQueue` (:data:`OPTIONS`: ``timeout``,
    ``at_front``, ``retry``, ...) plus ``job_id``, and override the queue's
    for this job only; ``unique_*`` ones are uniqjob settings for this call
    (``unique_on_conflict``, ``unique_lock_autoexpire``, ``unique_reschedule_delay``,
    as ``job_cls.using(...)`` takes them without the prefix; any other
    ``unique_*`` is a ConfigurationError). The job's own arguments are ``args`` and ``kwargs``,
    so a job may well have a parameter named ``timeout``. A call that parks
    behind a concurrency limit is pushed, when its turn comes, with the
    queue's options.
    """
    queue = job_cls.unique_queue
    if not isinstance(queue, RQQueue):
        raise ConfigurationError(f"{job_cls.job_name()}.unique_queue is {queue!r}, not an RQQueue")
    settings = {name: options.pop(name) for name in list(options) if name.startswith("unique_")}
    job_cls = _percall.using(job_cls, settings, prefix="unique_", where="enqueue_call()")
    _check_options(options, CALL_OPTIONS, "enqueue_call")
    kwargs = dict(kwargs or {})
    with in_context(_calls, _Call(job_cls, tuple(args), kwargs, options)):
        return job_cls.enqueue(*args, **kwargs)


def enqueue_again(ref: str, args: Sequence[Any], kwargs: dict[str, Any]) -> str | Retry | None:
    """A rescheduled call's next try (policy "reschedule"): the new RQ job id, None if dropped.

    Still locked, and rescheduled again: a ``Retry`` that has RQ run this
    same job again after ``unique_reschedule_delay`` (RQ 2.1+).
    """
    job_cls = resolve_job(ref)
    again = _Call(job_cls, tuple(args), dict(kwargs), again=True)
    with in_context(_calls, again):
        job = job_cls.enqueue(*args, **kwargs)
    if again.again_in is not None:
        # as many tries as it takes: the first job may run for hours
        return Retry(max=2**31, interval=math.ceil(again.again_in))
    return job.id if isinstance(job, Job) else None


def retry_delay(job: Job, exc: BaseException | None, result: Any) -> float | None:
    """Seconds until RQ runs ``job`` again after this attempt, or None if it never will."""
    if exc is not None:
        # RQ retries a raised exception while retries are left (a stopped job is
        # killed, so it never reaches here).
        if not job.retries_left or job.retries_left <= 0:
            return None
        return float(job.get_retry_interval())
    if _RETURNED_RETRY and isinstance(result, Retry):  # another run, until ``max`` of them
        done = job.number_of_retries or 0
        return None if done >= result.max else float(Retry.get_interval(done, result.intervals))
    return None
