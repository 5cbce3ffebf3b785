"""The work every backend is timed on: a job class, its queue, and the operations.

Each operation is measured at two layers: :class:`~uniqjob.JobLock` with a key
made beforehand (the backend's cost plus the lock policy), and
``UniqueJob.enqueue`` (that plus the key's canonical encoding, the call's
preview and the settings), so the cost of making a key shows as the gap.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.sampling import Op
from uniqjob import JobLock, Queue, UniqueJob
from uniqjob.locks import QueueMeta
from uniqjob.stores.base import Backend

__all__ = ["Latest", "NamingQueue", "NullQueue", "SendReport", "Workload"]


class NullQueue(Queue):
    """A queue that accepts every job and runs none: an enqueue costs the lock, not a queue."""

    def push(
        self, job_cls: type[UniqueJob], lock: JobLock, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Return the lock itself, so the benchmark can play the worker's side next."""
        return lock

    @property
    def proves_jobs_gone(self) -> bool:
        """Taken as True: the benchmark plays every job it accepts, so none is ever lost from it.

        (False would warn at each benchmark class's definition that a lost job strands its lock.)
        """
        return True


class SendReport(UniqueJob):
    """The job every enqueue is timed on: two arguments, one of them defaulted."""

    unique_queue = NullQueue()

    def perform(self, account_id: int, report: str = "daily") -> None:
        """Do nothing: the benchmark times the locks around the work, not the work."""


class NamingQueue(NullQueue):
    """A NullQueue that names each job before its claim and can delay it, as RQ does: what the
    coalescing policies need (``keep_last``, ``unique_debounce``)."""

    suspect_after = 60.0

    def new_job_id(self) -> str:
        return str(uuid.uuid4())

    def push_in(
        self,
        job_cls: type[UniqueJob],
        lock: JobLock,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        delay: float,
    ) -> Any:
        return lock


class Latest(SendReport):
    """SendReport whose duplicates coalesce: the queued call runs with the latest arguments."""

    unique_queue = NamingQueue()
    unique_on_conflict = "keep_last"


class Debounced(SendReport):
    """SendReport run a minute after the last call of a burst."""

    unique_queue = NamingQueue()
    unique_debounce = 60.0


def job_class(backend: Backend, base: type[SendReport] = SendReport) -> type[SendReport]:
    """Return ``base`` bound to ``backend``, with the same name (so the same keys)."""

    class Bound(base):  # type: ignore[valid-type,misc]
        unique_backend = backend

    Bound.__qualname__ = base.__qualname__
    return Bound


class Workload:
    """The timed operations over one backend; each call makes its own fresh key."""

    def __init__(self, backend: Backend, *, first_id: int = 0) -> None:
        self.backend = backend
        self.job = job_class(backend)
        self._ids = itertools.count(first_id)
        name = self.job.job_name()
        self.meta = QueueMeta(name, "1234")  # what the job layer records for enqueue(1234)
        self._key_prefix = f"{name}:1:{first_id:x}-"
        self.held_key = self._key_prefix + "held"
        if not JobLock(backend, self.held_key, meta=self.meta).acquire():
            raise RuntimeError(f"{backend!r} already holds {self.held_key}: use a fresh store")
        self.held_id = -1 - first_id
        self.latest, self.debounced = job_class(backend, Latest), job_class(backend, Debounced)
        for job in (self.job, self.latest, self.debounced):
            if not isinstance(job.enqueue(self.held_id), JobLock):
                raise RuntimeError(f"{backend!r} already holds the job key of {self.held_id}")

    def ops(self) -> dict[str, Op]:
        """Return each operation by name: ``<layer>.<fresh|duplicate|cycle>``."""
        return {
            "joblock.fresh": self.lock_fresh,
            "job.fresh": self.job_fresh,
            "joblock.duplicate": self.lock_duplicate,
            "job.duplicate": self.job_duplicate,
            "job.keep_last": self.job_keep_last,
            "job.debounce": self.job_debounce,
            "joblock.cycle": self.lock_cycle,
            "job.cycle": self.job_cycle,
        }

    def _key(self) -> str:
        return f"{self._key_prefix}{next(self._ids):x}"

    def lock_fresh(self) -> Callable[[], object]:
        """Take the queue lock of a key nobody holds; return how to drop it again."""
        lock = JobLock(self.backend, self._key(), meta=self.meta)
        if not lock.acquire():
            raise RuntimeError("a fresh key was already locked")
        return lock.dequeue

    def lock_duplicate(self) -> None:
        """Try the queue lock of a key that is queued: rejected."""
        if JobLock(self.backend, self.held_key, meta=self.meta).acquire():
            raise RuntimeError("a duplicate was let through")

    def lock_cycle(self) -> None:
        """Enqueue, start and end a job with a no-op body: three transitions."""
        lock = JobLock(self.backend, self._key(), meta=self.meta)
        if not lock.acquire():
            raise RuntimeError("a fresh key was already locked")
        with lock.running():
            pass

    def job_fresh(self) -> Callable[[], object]:
        """``enqueue`` a call nobody made before; return how to drop its lock again."""
        lock = self.job.enqueue(next(self._ids))
        if lock is None:
            raise RuntimeError("a fresh call was taken for a duplicate")
        return lock.dequeue  # type: ignore[no-any-return]

    def job_duplicate(self) -> None:
        """``enqueue`` a call that is queued already: dropped by the default policy."""
        if self.job.enqueue(self.held_id) is not None:
            raise RuntimeError("a duplicate was let through")

    def job_keep_last(self) -> None:
        """``enqueue`` a call that is queued already, keep_last: its arguments become the queued call's."""
        if isinstance(self.latest.enqueue(self.held_id), JobLock):
            raise RuntimeError("a duplicate was let through")

    def job_debounce(self) -> None:
        """``enqueue`` a call of a debounced burst: the queued job's arguments and due time move."""
        if isinstance(self.debounced.enqueue(self.held_id), JobLock):
            raise RuntimeError("a duplicate was let through")

    def job_cycle(self) -> None:
        """``enqueue`` a call, then run it as a queue's worker does: rebuild the lock, ``execute``."""
        account_id = next(self._ids)
        queued = self.job.enqueue(account_id)
        if queued is None:
            raise RuntimeError("a fresh call was taken for a duplicate")
        self.job.execute(self.job.lock_from(queued.key, queued.token), (account_id,), {})
