"""``@unique`` functions, imported by the test process and by the ``rq worker`` processes."""

from __future__ import annotations

from tests.integration_workers import client, job_done, job_started, pretend_other_host, wait_for_gate
from tests.rq_jobs import queue
from uniqjob import current_lock, unique

pretend_other_host()


@unique(lock_autoexpire=3600, on_conflict="raise", args=("account_id",))
def send_report(account_id: int, note: str = "") -> str:
    """Send account ``account_id`` its report."""
    lock = current_lock()
    held = "" if lock is None else lock.key
    return f"report {account_id} {note} under {held}"


@unique(run_lease=1.0)
def gated(name: str) -> str:
    """Starts, then waits until the test opens its gate (enqueued with RQ's own API)."""
    r = client()
    job_started(r, name)
    wait_for_gate(r, name)
    job_done(r, name)
    return name


@unique(queue=queue, run_lease=1.0)
def queued(name: str) -> str:
    """As ``gated``, on an RQQueue: ``queued.enqueue(name)`` takes the queue lock at enqueue."""
    r = client()
    job_started(r, name)
    wait_for_gate(r, name)
    job_done(r, name)
    return name


@unique(queue=queue, run_lease=1.0, once_per="1d")
def ticked(name: str) -> str:
    """Once a day, on an RQQueue: the tick's lock outlives the run, in the worker too."""
    r = client()
    job_started(r, name)
    wait_for_gate(r, name)
    job_done(r, name)
    return name


class Reports:
    """Instance methods: ``self`` is not part of the key."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    @unique(on_conflict="raise")
    def build(self, account_id: int) -> str:
        return f"{self.prefix}{account_id}"

    @unique(args=("self", "account_id"))
    def keyed(self, account_id: int) -> str:
        return f"{self.prefix}{account_id}"
