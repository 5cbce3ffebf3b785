"""A store with something to see, made with the library's own API, for the dashboard's tests.

:func:`build` leaves, in the configured store:

- ``account-1``: one Export in its queue (a fresh slot, the limit is 1) and two parked behind it;
- ``account-2``: an Export whose worker died while running it (a stale slot, and its
  uniqueness lock orphaned) with one parked behind it;
- ``account-3``: one Export in its queue whose argument holds a ``<script>``;
- a lock held by a live process (this one), and a queued Report with a job id;
- three duplicates dropped: the Report twice, the first Export once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import uniqjob
from tests.concurrency_jobs import RecordingQueue
from tests.test_concurrency_jobs import dead_holder
from uniqjob import UniqueJob
from uniqjob.concurrency import store_for
from uniqjob.locks import QueueMeta, RunClaim, local_holder
from uniqjob.stores.base import Backend

QUEUE = RecordingQueue()
SCRIPT = "<script>window.pwned = 1</script>"


class Export(UniqueJob):
    """One export per account at a time; the rest park."""

    unique_queue = QUEUE
    concurrency_limit = 1
    concurrency_duration = 60

    @classmethod
    def concurrency_key(cls, account: int, report: str = "") -> str:
        return f"account-{account}"

    def perform(self, account: int, report: str = "") -> str:
        return report


class Report(UniqueJob):
    """A plain unique job, no concurrency limit."""

    unique_queue = QUEUE

    def perform(self, day: str) -> str:
        return day


@dataclass(frozen=True)
class Scene:
    """The keys :func:`build` made."""

    backlog: str  # concurrency key: a fresh slot, two parked
    blocked: str  # concurrency key: a stale slot, one parked
    script: str  # concurrency key whose job's argument holds SCRIPT
    orphan: str  # lock key of the crashed job
    live: str  # lock key held by this process, running
    report: str  # lock key of the queued Report
    held: int = 8  # uniqueness locks held: 3 + 2 + 1 Exports, the live one, the Report
    drops: tuple[tuple[str, int], ...] = (
        ("tests.dashboard_jobs.Report", 2),
        ("tests.dashboard_jobs.Export", 1),
    )


def _crash(backend: Backend, entry: tuple[Any, ...]) -> None:
    """The worker that took this pushed job started it, then died."""
    job_cls, lock_key, token, args, kwargs = entry
    dead = dead_holder()
    slot = store_for(backend).start(
        job_cls.semaphore(*args, **kwargs).key, token, holder=dead, lease=60, takeover=None, caller=dead
    )
    assert slot.status == "run", slot
    queue = backend.read(lock_key).queue
    assert queue is not None
    assert backend.start(lock_key, token, run=RunClaim(dead, lease=60), meta=queue.meta) is None


def build(backend: Backend) -> Scene:
    """Fill ``backend`` (made the configured store) with the scene above."""
    uniqjob.configure(backend)
    QUEUE.pushed.clear()
    QUEUE.ids = 0
    for report in ("first", "second", "third"):
        Export.enqueue(1, report)
    Export.enqueue(2, "crashed")
    crashed = QUEUE.pushed[-1]
    Export.enqueue(2, "waiting")  # parked before the crash: a call after it would reclaim the slot
    _crash(backend, crashed)
    Export.enqueue(3, SCRIPT)
    live = backend.claim(
        "live-job", "t-live", meta=QueueMeta("app.jobs.Live", "7"), run=RunClaim(local_holder(), 60)
    )
    assert live is None
    Report.enqueue("2026-12-01")
    for duplicate in (Report.enqueue("2026-12-01"), Report.enqueue("2026-12-01"), Export.enqueue(1, "first")):
        assert duplicate is None  # dropped, and counted
    return Scene(
        backlog=Export.semaphore(1).key,
        blocked=Export.semaphore(2).key,
        script=Export.semaphore(3).key,
        orphan=Export.lock_key(2, "crashed"),
        live="live-job",
        report=Report.lock_key("2026-12-01"),
    )
