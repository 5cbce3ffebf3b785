"""Queue: the base class queue integrations implement, so ``enqueue`` can hand jobs over."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .job import UniqueJob
    from .joblock import JobLock

__all__ = ["Queue"]


class Queue:
    """Base of queue integrations: ``enqueue`` hands jobs to a ``Queue``.

    ``push`` is called with the queue lock already held; it must send
    ``lock.key`` and ``lock.token`` with the job, so the worker can rebuild the
    lock (``job_cls.lock_from(key, token)``) and run the job with
    ``job_cls.execute(lock, args, kwargs)``. If ``push`` raises, the queue lock
    is released and the error propagates: nothing stuck, nothing lost.
    """

    def new_job_id(self) -> str:
        """Return the id the next pushed job will have, recorded in its queue lock; "" if unknown."""
        return ""

    def push(
        self, job_cls: type[UniqueJob], lock: JobLock, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Hand the job to the queue with ``lock.meta.job_id`` as its id; return the queue's job handle."""
        raise NotImplementedError

    def push_later(
        self, job_cls: type[UniqueJob], args: tuple[Any, ...], kwargs: dict[str, Any], delay: float
    ) -> Any:
        """Call ``job_cls.enqueue(*args, **kwargs)`` again in ``delay`` seconds (policy "reschedule").

        The rescheduled call holds no lock until it is enqueued again. A queue
        that cannot delay jobs leaves this out; a class using "reschedule" on
        it is then a ConfigurationError when it is defined.
        """
        raise NotImplementedError

    @property
    def proves_jobs_gone(self) -> bool:
        """True if :meth:`job_gone` can prove a lost job gone (by default: if the class overrides it).

        A queue that cannot (a purged Celery task leaves no trace) strands a
        queued lock whose job is lost until ``unique_lock_autoexpire`` passes:
        a class on it with none is warned about when it is defined.
        """
        return type(self).job_gone is not Queue.job_gone

    def job_gone(self, job_id: str) -> bool:
        """True only if the queue can prove that job ``job_id`` will never run (deleted, expired).

        A queued lock whose job is gone is reclaimed at the next enqueue. When
        in doubt, return False: the lock is then kept.
        """
        return False

    def pending_delay(self) -> float:
        """Seconds until the job about to be pushed may start (a countdown, an ETA); 0 if at once.

        A concurrency slot taken at enqueue keeps its job's place for its lease
        plus this delay, so a delayed job does not lose its slot while it waits.
        """
        return 0.0
