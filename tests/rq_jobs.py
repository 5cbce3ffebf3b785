"""Job classes on RQ queues, imported by the test process and by the ``rq worker`` processes."""

from __future__ import annotations

import os
import time
from typing import ClassVar

from redis import Redis
from rq import Queue, Retry

from tests.integration_workers import (
    URL_VAR,
    client,
    job_done,
    job_started,
    pretend_other_host,
    wait_for_gate,
)
from uniqjob import UniqueJob
from uniqjob.integrations.rq import RQQueue
from uniqjob.settings import ConflictPolicy

pretend_other_host()

QUEUE = "uniqjob-test"


def rq_queue() -> Queue:
    """The RQ queue of the tests, on the test Redis (made on first use: the URL is known late)."""
    return Queue(QUEUE, connection=Redis.from_url(os.environ[URL_VAR]))


queue = RQQueue(rq_queue)


class Gate(UniqueJob):
    """Starts, then waits until the test opens its gate."""

    unique_queue = queue
    unique_run_lease = 1.0

    def perform(self, name: str) -> str:
        r = client()
        job_started(r, name)
        wait_for_gate(r, name)
        job_done(r, name)
        return name


class Flaky(UniqueJob):
    """Fails its first ``failures`` attempts; RQ retries it twice, a second apart."""

    unique_queue = RQQueue(rq_queue, retry=Retry(max=2, interval=1))
    unique_run_lease = 2.0

    def perform(self, name: str, failures: int, gated: bool = True) -> int:
        r = client()
        attempt = job_started(r, name)
        if gated:
            wait_for_gate(r, f"{name}:{attempt}")
        if attempt <= failures:
            raise RuntimeError(f"attempt {attempt} of {name} fails")
        job_done(r, name)
        return attempt


class Rescheduled(Gate):
    """A duplicate tries again a second later instead of being dropped."""

    unique_on_conflict = "reschedule"
    unique_reschedule_delay = 1.0


class UntilExecuting(Gate):
    """Locked from enqueue until perform starts."""

    unique_strategy = "until_executing"


class WhileExecuting(Gate):
    """Locked only while perform runs: duplicates queue, and are dropped if they start meanwhile."""

    unique_strategy = "while_executing"


class UntilAndWhileExecuting(Gate):
    """Locked while queued, then (swapped at start) while perform runs."""

    unique_strategy = "until_and_while_executing"


class UntilExpired(Gate):
    """Locked from enqueue until its autoexpire passes, however soon it ran."""

    unique_strategy = "until_expired"
    unique_lock_autoexpire = 3.0


class Timed(UniqueJob):
    """A job with a parameter of the name of an RQ option: ``timeout``."""

    unique_queue = queue

    def perform(self, name: str, timeout: float) -> float:
        r = client()
        job_started(r, name)
        job_done(r, name)
        return timeout


class Inline(UniqueJob):
    """On a queue in RQ's sync mode: enqueue runs it at once, in the caller's process."""

    unique_queue = RQQueue(
        lambda: Queue("inline", connection=Redis.from_url(os.environ[URL_VAR]), is_async=False)
    )

    def perform(self, n: int) -> tuple[bool, object]:
        return Inline.is_locked(n), Inline.enqueue(n)


class OneAtATime(Gate):
    """One concurrency slot for the class: the others park, and are enqueued into RQ in turn."""

    concurrency_limit = 1
    concurrency_on_conflict = "block"


class Latest(UniqueJob):
    """keep_last: calls of one name coalesce, the latest version wins; each run waits at the gate ``name``."""

    unique_queue = queue
    unique_on_conflict: ClassVar[ConflictPolicy] = "keep_last"
    unique_args = ("name",)
    unique_run_lease = 1.0

    def perform(self, name: str, version: int) -> int:
        r = client()
        r.rpush(f"versions:{name}", version)
        job_started(r, name)
        wait_for_gate(r, name)
        job_done(r, name)
        return version


class Replaced(Latest):
    """replace: a call while one is queued takes its place."""

    unique_on_conflict = "replace"


class Busy(UniqueJob):
    """keep_last without a gate: counts the runs at once of its name (``overlaps`` if ever two)."""

    unique_queue = queue
    unique_on_conflict = "keep_last"
    unique_args = ("name",)
    unique_run_lease = 2.0

    def perform(self, name: str, version: int) -> None:
        r = client()
        if r.incr(f"running:{name}") > 1:
            r.incr(f"overlaps:{name}")
        r.rpush(f"versions:{name}", version)
        time.sleep(0.02)
        r.decr(f"running:{name}")


def trigger(name: str, first: int, count: int) -> None:
    """Call Busy ``count`` times, versions ``first``, ``first + 1``, ... (one process of a race)."""
    for version in range(first, first + count):
        Busy.enqueue(name, version)


class Debounced(UniqueJob):
    """Runs a second after the last call of its name, with that call's version."""

    unique_queue = queue
    unique_debounce = 1.0
    unique_args = ("name",)
    unique_run_lease = 2.0

    def perform(self, name: str, version: int) -> int:
        r = client()
        r.rpush(f"versions:{name}", version)
        job_started(r, name)
        job_done(r, name)
        return version


class Bounded(Debounced):
    """Debounced, but runs at the latest 2 s after the first call of a burst."""

    unique_debounce_max_wait = 2.0
