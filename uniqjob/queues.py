"""Queue: the base class queue integrations implement, so ``enqueue`` can hand jobs over."""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .job import UniqueJob
    from .joblock import JobLock

__all__ = ["Queue"]

_clock = time.monotonic  # replaced by tests
#: How many job ids a queue remembers having asked about (see Queue.may_ask).
_REMEMBERED = 4096


class Queue:
    """Base of queue integrations: ``enqueue`` hands jobs to a ``Queue``.

    ``push`` is called with the queue lock already held; it must send
    ``lock.key`` and ``lock.token`` with the job, so the worker can rebuild the
    lock (``job_cls.lock_from(key, token)``) and run the job with
    ``job_cls.execute(lock, args, kwargs)``. If ``push`` raises, the queue lock
    is released and the error propagates: nothing stuck, nothing lost.
    """

    #: Seconds a queued lock must have been held (the store's clock) before a conflicting
    #: enqueue asks :meth:`job_gone` about its job; and, in each process, how long it then
    #: waits before asking about that job again. A number: :meth:`new_job_id` is chosen
    #: before the claim and the claim records it (one round trip to the lock store, nothing
    #: attached after the push), and a duplicate of a younger lock costs that one round
    #: trip. None (the default, for queues written before): the id is recorded once the job
    #: is pushed (one round trip more) and asked about at the next conflict. See docs/rq.md,
    #: "Cost, and is the holder's job gone?".
    suspect_after: float | None = None

    def new_job_id(self) -> str:
        """Return the id the next pushed job will have, recorded in its queue lock; "" if unknown."""
        return ""

    def may_ask(self, job_id: str) -> bool:
        """True unless this process asked about job ``job_id`` less than ``suspect_after`` seconds ago.

        Each True is remembered (the last few thousand job ids): a stream of duplicates of a
        long-queued job asks its queue about it once per ``suspect_after``, not at every call.
        """
        window = self.suspect_after
        if not window:
            return True
        now = _clock()
        with _asked_mutex:
            asked = _asked.setdefault(self, OrderedDict())
            last = asked.get(job_id)
            if last is not None and now - last < window:
                return False
            asked[job_id] = now
            asked.move_to_end(job_id)
            while len(asked) > _REMEMBERED:
                asked.popitem(last=False)
        return True

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

    def push_in(
        self,
        job_cls: type[UniqueJob],
        lock: JobLock,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        delay: float,
    ) -> Any:
        """:meth:`push`, the job to start in ``delay`` seconds (``unique_debounce``). A queue that
        cannot delay a job leaves this out; a class debounced on it is then a ConfigurationError."""
        raise NotImplementedError

    def handle(self, job_id: str) -> Any:
        """The queue's handle of its job ``job_id``, made without asking the queue; None if it has none.

        A "use_existing" duplicate gets this, to wait for the result of the job on its way (a class
        using "use_existing" on a queue that leaves this out is a ConfigurationError when it is
        defined); a "keep_last" duplicate, the queued job's. An async queue (arq) may return an
        awaitable.
        """
        return None

    def remove(self, job_id: str) -> Any:
        """Take job ``job_id`` out of the queue, if it is still there (policy "replace": the job whose
        call was replaced). Best effort: the store refuses that job's start anyway. A queue that
        cannot leaves this out; a class using "replace" on it is then a ConfigurationError."""
        raise NotImplementedError

    def pending_delay(self) -> float:
        """Seconds until the job about to be pushed may start (a countdown, an ETA); 0 if at once.

        The job's queue lock (its autoexpire) and a concurrency slot taken at enqueue
        (its lease) last this much longer, so a delayed job loses neither while it waits.
        """
        return 0.0


# Per queue: job id -> when this process last asked about it.
_asked: weakref.WeakKeyDictionary[Queue, OrderedDict[str, float]] = weakref.WeakKeyDictionary()
_asked_mutex = threading.Lock()
