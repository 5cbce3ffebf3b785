"""Job classes for the concurrency tests, importable by path (parked calls store it)."""

from __future__ import annotations

import enum
import threading
import time
from typing import Any, ClassVar

from uniqjob import Queue, UniqueJob
from uniqjob.joblock import JobLock


class Color(enum.Enum):
    RED = "red"


class RecordingQueue(Queue):
    """A queue in a list: ``push`` records the job, ``work`` runs what was pushed, as a worker would."""

    def __init__(self) -> None:
        self.pushed: list[tuple[type[UniqueJob], str, str, tuple[Any, ...], dict[str, Any]]] = []
        self.fail = False
        self.ids = 0

    def new_job_id(self) -> str:
        self.ids += 1
        return f"job-{self.ids}"

    def push(
        self, job_cls: type[UniqueJob], lock: JobLock, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if self.fail:
            raise ConnectionError("queue down")
        self.pushed.append((job_cls, lock.key, lock.token, args, kwargs))
        return lock.meta.job_id

    def work(self, *, limit: int = 1000) -> list[Any]:
        """Run pushed jobs (and those their ends promote) in order; return their results."""
        results = []
        while self.pushed and limit:
            limit -= 1
            job_cls, key, token, args, kwargs = self.pushed.pop(0)
            results.append(job_cls.execute(job_cls.lock_from(key, token), args, kwargs))
        return results


QUEUE = RecordingQueue()
RAN: list[tuple[str, Any]] = []
_ran_mutex = threading.Lock()


def ran(name: str, value: Any) -> None:
    with _ran_mutex:
        RAN.append((name, value))


class Limited(UniqueJob):
    """Queued; two at a time per order; "block" parks the rest."""

    unique_queue = QUEUE
    concurrency_limit = 2
    concurrency_duration = 60

    @classmethod
    def concurrency_key(cls, order: int, n: int = 0, **kwargs: Any) -> str:
        return f"order-{order}"

    def perform(self, order: int, n: int = 0, **kwargs: Any) -> int:
        ran("Limited", (order, n))
        return n


class Discarding(UniqueJob):
    unique_queue = QUEUE
    concurrency_limit = 1
    concurrency_on_conflict = "discard"

    def perform(self, n: int) -> int:
        ran("Discarding", n)
        return n


class Raising(UniqueJob):
    unique_queue = QUEUE
    concurrency_limit = 1
    concurrency_on_conflict = "raise"

    def perform(self, n: int) -> int:
        ran("Raising", n)
        return n


class Inline(UniqueJob):
    """No queue: "block" waits in the calling thread."""

    concurrency_limit = 1
    unique_run_lease = 3.0

    def perform(self, n: int, pause: float = 0.0) -> int:
        ran("Inline+", n)
        time.sleep(pause)
        ran("Inline-", n)
        return n


class InlineTimeout(UniqueJob):
    concurrency_limit = 1
    concurrency_wait_timeout = 0.2

    def perform(self, n: int, release: threading.Event | None = None) -> int:
        if release is not None:
            release.wait(10)
        return n

    @classmethod
    def unique_key(cls, n: int, release: threading.Event | None = None) -> Any:
        return n


class AnyKey(UniqueJob):
    concurrency_limit = 1

    @classmethod
    def concurrency_key(cls, value: Any) -> Any:
        return value

    @classmethod
    def unique_key(cls, value: Any) -> Any:
        return 0

    def perform(self, value: Any) -> None:
        pass


class LaterQueue(RecordingQueue):
    """A queue whose jobs start an hour after they are pushed."""

    def pending_delay(self) -> float:
        return 3600.0


class Delayed(UniqueJob):
    unique_queue = LaterQueue()
    concurrency_limit = 1
    concurrency_duration = 60

    def perform(self, n: int) -> int:
        return n


class Flaky(UniqueJob):
    """One at a time; the first attempt of each call fails (its queue retries it)."""

    unique_queue = QUEUE
    concurrency_limit = 1
    concurrency_duration = 60
    attempts: ClassVar[dict[int, int]] = {}

    def perform(self, n: int) -> int:
        tries = Flaky.attempts[n] = Flaky.attempts.get(n, 0) + 1
        ran("Flaky", (n, tries))
        if tries == 1:
            raise RuntimeError(f"attempt 1 of {n} fails")
        return n


class StuckQueue(RecordingQueue):
    """A broker whose publish hangs until ``unstick`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.unstick = threading.Event()
        self.entered = threading.Event()

    def push(
        self, job_cls: type[UniqueJob], lock: JobLock, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        self.entered.set()
        self.unstick.wait(30)
        return super().push(job_cls, lock, args, kwargs)


class Stuck(UniqueJob):
    """Two at a time; parked calls are pushed to a queue that hangs."""

    unique_queue = StuckQueue()
    concurrency_limit = 2
    concurrency_duration = 60
    unique_run_lease = 1.0  # a heartbeat every third of a second (the shortest lease)

    def perform(self, n: int) -> int:
        return n
