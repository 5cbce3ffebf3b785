"""The part every queue integration shares: lock data, job references, delivery and retries.

Run against every backend; the RQ and Celery tests run the same paths with real workers.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import pytest

import uniqjob
from uniqjob import ConfigurationError, JobLock, UniqueJob
from uniqjob.integrations import (
    KEEP,
    Decision,
    Ticket,
    job_ref,
    perform,
    resolve_job,
)
from uniqjob.locks import Holder, QueueMeta, RunClaim, local_holder
from uniqjob.queues import Queue
from uniqjob.stores.base import Backend

NOT_A_JOB = "a module attribute that is no job class"


class Plain(UniqueJob):
    """Records what it saw while it ran; fails when asked to."""

    seen: ClassVar[list[bool]] = []

    def perform(self, n: int, fail: bool = False) -> int:
        self.seen.append(Plain.is_locked(n, fail))
        if fail:
            raise RuntimeError("asked to fail")
        return n


@pytest.fixture
def use(backend: Backend) -> Backend:
    uniqjob.configure(backend)
    Plain.seen.clear()
    return backend


def enqueued(n: int, fail: bool = False, job_id: str = "job-1") -> JobLock:
    """Plain's lock as a queue integration holds it once the job is in the queue."""
    lock = Plain.lock(n, fail)
    lock.meta = QueueMeta(lock.meta.cls, lock.meta.args, job_id)
    assert lock.acquire()
    assert lock.attach()  # pushed: the queue now holds job_id
    return lock


def delivered(lock: JobLock) -> JobLock:
    """The same lock as a worker rebuilds it from the job's lock data."""
    again = Plain.lock_from(lock.key, lock.token)
    again.meta = QueueMeta(again.meta.cls, again.meta.args, lock.meta.job_id)
    return again


# -- lock data and job references ---------------------------------------------------------


def test_lock_data_and_job_references_that_cannot_be_read_say_why() -> None:
    with pytest.raises(ConfigurationError, match="RQ job 9 carries no uniqjob lock data"):
        Ticket.load(None, "RQ job 9")
    with pytest.raises(ConfigurationError, match="RQ job 9 carries malformed uniqjob lock data"):
        Ticket.load({"key": "k", "token": 7}, "RQ job 9")
    with pytest.raises(ConfigurationError, match="malformed"):
        Ticket.load({"key": "k", "token": "t", "job": 3}, "RQ job 9")
    assert Ticket.load(Ticket("k", "t", "m:C").dump(), "x") == Ticket("k", "t", "m:C")
    assert Ticket("k", "t").dump() == {"key": "k", "token": "t"}
    with pytest.raises(ConfigurationError, match="expected 'module:QualName'"):
        resolve_job("tests.test_integrations.Plain")
    with pytest.raises(ConfigurationError, match=r"cannot import job class 'tests\.test_integrations:Nope'"):
        resolve_job("tests.test_integrations:Nope")
    with pytest.raises(ConfigurationError, match="is not a UniqueJob class"):
        resolve_job("tests.test_integrations:NOT_A_JOB")
    assert job_ref(Plain) == "tests.test_integrations:Plain"
    assert resolve_job(job_ref(Plain)) is Plain


def test_a_job_class_a_worker_cannot_import_has_no_reference() -> None:
    class Local(UniqueJob):
        def perform(self) -> None:
            pass

    with pytest.raises(ConfigurationError, match="cannot be imported by a worker"):
        job_ref(Local)
    Local.__module__, Local.__qualname__ = "__main__", "Local"
    with pytest.raises(ConfigurationError, match="not in __main__"):
        job_ref(Local)


# -- one delivery --------------------------------------------------------------------------


def test_a_delivery_that_ends_for_good_releases_the_lock(use: Backend) -> None:
    lock = enqueued(1)
    assert perform(Plain, delivered(lock), (1,), {}, lambda exc, result: None) == 1
    assert Plain.seen == [True]  # locked while it ran
    assert use.read(lock.key).free


def test_a_delivery_to_be_retried_keeps_the_lock_queued(use: Backend) -> None:
    lock = enqueued(2, True)
    decisions: list[tuple[object, object]] = []

    def decide(exc: BaseException | None, result: Any) -> Decision:
        decisions.append((type(exc), result))
        return 5.0

    with pytest.raises(RuntimeError, match="asked to fail"):
        perform(Plain, delivered(lock), (2, True), {}, decide)
    assert decisions == [(RuntimeError, None)]
    state = use.read(lock.key)
    assert state.queue is not None and state.run is None
    assert state.queue.state == "queued" and state.queue.token == lock.token
    assert state.queue.meta.job_id == "job-1"  # the queue can still say whether its job is gone
    assert Plain.enqueue(2, True) is None  # duplicates still conflict while the retry waits

    # the retry: same token, same lock
    assert perform(Plain, delivered(lock), (2, False), {}, lambda exc, result: None) == 2
    assert use.read(lock.key).free


def test_a_delivery_already_settled_is_left_alone(use: Backend) -> None:
    lock = enqueued(3)
    perform(Plain, delivered(lock), (3,), {}, lambda exc, result: KEEP)
    state = use.read(lock.key)
    assert state.queue is not None and state.queue.token == lock.token and state.run is not None


# -- requeue (JobLock), the lock's side of a retry -----------------------------------------


def test_requeue_puts_the_lock_back_to_queued_with_its_autoexpire_plus_the_delay(backend: Backend) -> None:
    lock = JobLock(backend, "k", ttl=10.0, meta=QueueMeta("Job", "1", "job-7"))
    assert lock.acquire() and lock.attach()
    lock.start()
    with lock.running(started=True, release=False):
        pass
    held = backend.read("k")
    assert held.queue is not None and held.queue.state == "running" and held.run is not None  # kept

    assert lock.requeue(delay=5.0)
    waiting = backend.read("k")
    assert waiting.run is None and waiting.queue is not None
    assert waiting.queue.state == "queued" and waiting.queue.token == lock.token
    assert waiting.queue.meta == QueueMeta("Job", "1", "job-7")
    assert waiting.queue.ttl is not None and 14.0 < waiting.queue.ttl <= 15.0
    assert lock.requeue()  # again: nothing changes
    again = backend.read("k").queue
    assert again is not None
    assert (again.token, again.state, again.meta) == (lock.token, "queued", waiting.queue.meta)
    assert not JobLock(backend, "k").acquire()  # a duplicate conflicts


def test_requeue_never_takes_a_key_that_changed_hands(backend: Backend) -> None:
    lock = JobLock(backend, "k")
    assert lock.acquire()
    lock.start()
    backend.reclaim("k", lock.token, lock.token)  # say our holder was reaped as dead...
    successor = JobLock(backend, "k")
    assert successor.acquire()  # ... and another enqueue took the key
    assert not lock.requeue()
    after = backend.read("k")
    assert after.queue is not None and after.queue.token == successor.token


def test_requeue_of_a_while_executing_lock_only_drops_its_run_lock(backend: Backend) -> None:
    lock = JobLock(backend, "k", strategy="while_executing")
    lock.start()
    assert lock.requeue()
    assert backend.read("k").free  # nothing is held while a while_executing job waits


# -- a second delivery while the first still runs ------------------------------------------


def test_a_second_live_delivery_is_refused_and_a_crashed_ones_redelivery_runs(use: Backend) -> None:
    lock = enqueued(4)
    me = local_holder()
    parent = Holder(me.host, me.node, os.getppid(), _pstart(os.getppid()))  # alive, and not us
    assert use.start(lock.key, lock.token, run=RunClaim(parent, 30.0, "first"), meta=lock.meta) is None
    # the broker delivers the same job (same token) again while that first delivery runs
    assert perform(Plain, delivered(lock), (4,), {}, lambda exc, result: None) is None
    assert Plain.seen == []  # refused: not run
    held = use.read(lock.key)
    assert held.run is not None and held.run.holder == parent  # the first delivery keeps its locks
    assert held.queue is not None and (held.queue.token, held.queue.state) == (lock.token, "running")

    crashed = enqueued(5, job_id="job-2")
    dead = Holder(me.host, me.node, 2**22 + 1, 1)  # no such pid: a crash, so a redelivery re-takes it
    assert use.start(crashed.key, crashed.token, run=RunClaim(dead, 30.0, "first"), meta=crashed.meta) is None
    assert perform(Plain, delivered(crashed), (5,), {}, lambda exc, result: None) == 5
    assert Plain.seen == [True]
    assert use.read(crashed.key).free


def _pstart(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def test_a_queues_pending_delay_lengthens_the_lock_autoexpire() -> None:
    """A queue whose job waits (a countdown, an ETA) says so in pending_delay: the lock waits as long."""

    class Later(Queue):
        def pending_delay(self) -> float:
            return 3600.0

    class Delayed(UniqueJob):
        unique_queue = Later()
        unique_lock_autoexpire: ClassVar[float | None] = 60

        def perform(self, n: int) -> None:
            pass

    class Unexpiring(Delayed):
        unique_lock_autoexpire = None

    assert Delayed.autoexpire() == 3660.0 and Delayed.lock(1).ttl == 3660.0
    assert Unexpiring.autoexpire() is None and Unexpiring.lock(1).ttl is None
