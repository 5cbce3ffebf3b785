"""RQ integration: unique jobs on RQ queues, run by a plain ``rq worker``.

A job class declares its queue once::

    class SendReport(UniqueJob):
        unique_queue = RQQueue(Queue("reports", connection=Redis()), retry=Retry(max=3))

        def perform(self, account_id: int) -> None: ...

    SendReport.enqueue(42)   # takes the lock, then enqueues into RQ; None for a duplicate

What RQ runs is :func:`run_job`: it reads the lock key and token from the job's
meta (never recomputed from arguments RQ may have transformed), holds the lock
while ``perform`` runs, and releases it when the job is done for good: finished,
failed with no retries left, or dropped by the conflict policy. While RQ still
means to retry it, the lock stays held, ``queued``. The queue lock records the
RQ job id, and :meth:`RQQueue.job_gone` lets the next enqueue reclaim a lock
whose job RQ no longer has (deleted, cancelled, emptied from its queue,
expired, failed or stopped).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import redis
from rq import Queue as RQ
from rq import Retry, get_current_job
from rq.job import Job

from ..errors import ConfigurationError
from ..job import Queue, UniqueJob
from ..joblock import JobLock
from . import HEADER, Ticket, job_ref, perform, resolve_job

__all__ = ["RQQueue", "enqueue_again", "run_job"]

log = logging.getLogger(__name__)

#: Options of RQ's ``enqueue_call`` that every job of an RQQueue gets. Left out on
#: purpose: ``depends_on`` (a job stuck behind a failed dependency is not provably
#: gone, so its lock would wait for autoexpire) and ``repeat`` (a repeated run
#: would come back after its lock was released).
OPTIONS = frozenset(
    {
        "timeout",
        "result_ttl",
        "ttl",
        "failure_ttl",
        "retry",
        "at_front",
        "on_success",
        "on_failure",
        "on_stopped",
    }
)

# Statuses after which RQ never runs a job again without someone requeuing it by hand.
_GONE = frozenset({"finished", "failed", "stopped", "canceled"})


class RQQueue(Queue):
    """An RQ queue as a job class's ``unique_queue``.

    ``queue`` is an ``rq.Queue``, or a function returning one (called once, on
    first use, for apps that connect to Redis at startup). ``options`` are RQ
    job options (:data:`OPTIONS`) given to every job, e.g. ``retry=Retry(max=3)``
    or ``timeout=600``.
    """

    def __init__(self, queue: RQ | Callable[[], RQ], **options: Any) -> None:
        unknown = sorted(set(options) - OPTIONS)
        if unknown:
            known = ", ".join(sorted(OPTIONS))
            raise ConfigurationError(f"RQQueue does not take {', '.join(unknown)} (it takes: {known})")
        if not (isinstance(queue, RQ) or callable(queue)):
            raise ConfigurationError(f"RQQueue needs an rq.Queue or a function returning one, got {queue!r}")
        retry = options.get("retry")
        if retry is not None and not isinstance(retry, Retry):
            raise ConfigurationError(f"RQQueue retry must be an rq.Retry, got {retry!r}")
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

    def new_job_id(self) -> str:
        """Return a fresh RQ job id, recorded in the job's queue lock."""
        return str(uuid.uuid4())

    def push(
        self, job_cls: type[UniqueJob], lock: JobLock, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Job:
        """Enqueue the job into RQ, with its lock's key and token in the job's meta."""
        ticket = Ticket(lock.key, lock.token, job_ref(job_cls))
        options = dict(self.options)
        at_front = bool(options.pop("at_front", False))
        return self.queue.enqueue_call(
            run_job,
            args=args,
            kwargs=kwargs,
            job_id=lock.meta.job_id or None,
            meta={HEADER: ticket.dump()},
            description=f"{job_cls.job_name()}({lock.meta.args})",
            at_front=at_front,
            **options,
        )

    def push_later(
        self, job_cls: type[UniqueJob], args: tuple[Any, ...], kwargs: dict[str, Any], delay: float
    ) -> Job:
        """Have a worker call ``job_cls.enqueue(*args, **kwargs)`` in ``delay`` seconds (RQ's scheduler).

        The scheduler runs inside workers started with ``rq worker --with-scheduler``.
        """
        call = (job_ref(job_cls), list(args), dict(kwargs))
        description = f"uniqjob: enqueue {job_cls.job_name()} again"
        if delay <= 0:
            return self.queue.enqueue_call(enqueue_again, args=call, description=description)
        return self.queue.enqueue_in(
            timedelta(seconds=delay), enqueue_again, args=call, description=description
        )

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
    lock = job_cls.lock_from(ticket.key, ticket.token)
    lock.meta = replace(lock.meta, job_id=job.id)
    return perform(job_cls, lock, args, kwargs, lambda exc, result: retry_delay(job, exc, result))


def enqueue_again(ref: str, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """A rescheduled call's second try (policy "reschedule"); returns the new RQ job id, None if dropped."""
    job = resolve_job(ref).enqueue(*args, **kwargs)
    return job.id if isinstance(job, Job) else None


def retry_delay(job: Job, exc: BaseException | None, result: Any) -> float | None:
    """Seconds until RQ runs ``job`` again after this attempt, or None if it never will."""
    if exc is not None:
        # RQ retries a raised exception while retries are left (a stopped job is
        # killed, so it never reaches here).
        if not job.retries_left or job.retries_left <= 0:
            return None
        return float(job.get_retry_interval())
    get_interval = getattr(Retry, "get_interval", None)
    if isinstance(result, Retry) and get_interval is not None:
        # Returning a Retry (RQ 2.1+, which added Retry.get_interval with it) asks for
        # another run, until ``max`` of them.
        done = job.number_of_retries or 0
        if done >= result.max:
            return None
        return float(get_interval(done, result.intervals))
    return None
