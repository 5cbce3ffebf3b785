"""The work every backend is timed on: a job class, its queue, and the operations.

Each operation is measured at two layers: :class:`~uniqjob.JobLock` with a key
made beforehand (the backend's cost plus the lock policy), and
``UniqueJob.enqueue`` (that plus the key's canonical encoding, the call's
preview and the settings), so the cost of making a key shows as the gap.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from benchmarks.sampling import Op
from uniqjob import JobLock, Queue, UniqueJob
from uniqjob.locks import QueueMeta
from uniqjob.stores.base import Backend

__all__ = ["NullQueue", "SendReport", "Workload"]


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


def job_class(backend: Backend) -> type[SendReport]:
    """Return ``SendReport`` bound to ``backend``, with the same name (so the same keys)."""

    class Bound(SendReport):
        unique_backend = backend

    Bound.__qualname__ = SendReport.__qualname__
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
        if self.job.enqueue(self.held_id) is None:
            raise RuntimeError(f"{backend!r} already holds the job key of {self.held_id}")

    def ops(self) -> dict[str, Op]:
        """Return each operation by name: ``<layer>.<fresh|duplicate|cycle>``."""
        return {
            "joblock.fresh": self.lock_fresh,
            "job.fresh": self.job_fresh,
            "joblock.duplicate": self.lock_duplicate,
            "job.duplicate": self.job_duplicate,
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

    def job_cycle(self) -> None:
        """``enqueue`` a call, then run it as a queue's worker does: rebuild the lock, ``execute``."""
        account_id = next(self._ids)
        queued = self.job.enqueue(account_id)
        if queued is None:
            raise RuntimeError("a fresh call was taken for a duplicate")
        self.job.execute(self.job.lock_from(queued.key, queued.token), (account_id,), {})
