"""Uniqueness strategies, lock limits and the reschedule policy, on every store."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import pytest

import uniqjob
from tests.conftest import FakeClock
from tests.test_job import RecordingQueue
from uniqjob import ConfigurationError, JobNotUnique, Queue, UniqueJob, _job_base
from uniqjob.locks import QueueMeta, RunClaim, local_holder
from uniqjob.stores.base import Backend
from uniqjob.stores.memory import MemoryBackend


@pytest.fixture
def use(backend: Backend) -> Backend:
    uniqjob.configure(backend)
    return backend


class DelayingQueue(RecordingQueue):
    def __init__(self) -> None:
        super().__init__()
        self.later: list[tuple[tuple[Any, ...], float]] = []

    def push_later(
        self, job_cls: type[UniqueJob], args: tuple[Any, ...], kwargs: dict[str, Any], delay: float
    ) -> Any:
        self.later.append((args, delay))


def deliver(job: type[UniqueJob], n: int = 0) -> Any:
    """Run the ``n``th pushed job as a worker would."""
    queue = job.unique_queue
    assert isinstance(queue, RecordingQueue)
    key, token, args = queue.jobs[n]
    return job.execute(job.lock_from(key, token), args, {})


class ProbeJob(UniqueJob):
    """A job whose perform records its call and runs ``probe`` (set per test) inside the locks."""

    probe: ClassVar[Any] = None
    ran: ClassVar[list[int]] = []

    def perform(self, n: int) -> str:
        type(self).ran.append(n)
        if type(self).probe is not None:
            type(self).probe()
        return f"done {n}"


def make(strategy: str, **attrs: Any) -> type[ProbeJob]:
    """A fresh queued job class with these settings, validated as at definition."""
    settings = {"unique_strategy": strategy, "unique_queue": RecordingQueue(), "ran": [], **attrs}
    return type("Job", (ProbeJob,), settings)


def test_until_executed_is_the_default(use: Backend) -> None:
    Job = make("until_executed")
    assert Job.enqueue(1) and Job.enqueue(1) is None
    seen: list[bool] = []
    Job.probe = lambda: seen.append(Job.enqueue(1) is None)
    assert deliver(Job) == "done 1"
    assert seen == [True]  # locked while running, too
    assert Job.enqueue(1)


def test_until_executing_frees_the_key_when_perform_starts(use: Backend) -> None:
    Job = make("until_executing")
    assert Job.enqueue(1) and Job.enqueue(1) is None
    seen: list[Any] = []
    Job.probe = lambda: seen.append((Job.is_locked(1), Job.enqueue(1)))
    assert deliver(Job) == "done 1"
    assert seen == [(False, "job-2")]  # a duplicate takes no job id
    assert Job.is_locked(1)  # the second enqueue is queued


def test_while_executing_queues_duplicates_but_runs_one_at_a_time(use: Backend) -> None:
    Job = make("while_executing")
    assert Job.enqueue(1) and Job.enqueue(1)  # no lock at enqueue
    inner: list[Any] = []
    Job.probe = lambda: inner.append(deliver(Job, 1)) if not inner else None
    assert deliver(Job, 0) == "done 1"
    assert inner == [None] and Job.ran == [1]  # the duplicate, delivered meanwhile, was dropped
    assert deliver(Job, 1) == "done 1"  # delivered again afterwards, it runs
    assert use.read(Job.lock_key(1)).free


def test_while_executing_failed_attempt_lets_a_retry_run(use: Backend) -> None:
    Job = make("while_executing")
    assert Job.enqueue(1)

    def fail() -> None:
        raise RuntimeError("transient")

    Job.probe = fail
    with pytest.raises(RuntimeError):
        deliver(Job)
    Job.probe = None
    assert deliver(Job) == "done 1"


def test_while_executing_crashed_attempt_is_readopted_by_the_same_job(use: Backend) -> None:
    Job = make("while_executing")
    assert Job.enqueue(1)
    key, token, _ = Job.unique_queue.jobs[0]  # type: ignore[union-attr]
    # an attempt by a process that has died since, without releasing
    me = local_holder()
    dead = RunClaim(replace(me, pstart=me.pstart + 1), 30.0, "crashed-attempt")
    assert use.start(key, token, run=dead, meta=QueueMeta(), queue_lock="keep") is None
    assert deliver(Job) == "done 1"  # same token, holder dead: re-acquired, not a duplicate
    assert use.read(key).free


def test_same_job_on_a_live_holder_elsewhere_waits_for_its_lease(use: Backend) -> None:
    Job = make("while_executing")
    assert Job.enqueue(1)
    key, token, _ = Job.unique_queue.jobs[0]  # type: ignore[union-attr]
    far = RunClaim(replace(local_holder(), host="other-host", node="other"), 30.0, "first-delivery")
    assert use.start(key, token, run=far, meta=QueueMeta(), queue_lock="keep") is None
    assert deliver(Job) is None  # it may still be running there: never robbed
    assert Job.ran == []


@pytest.mark.parametrize("policy", ["log", "raise", "reschedule"])
@pytest.mark.parametrize("strategy", ["until_executed", "while_executing", "until_and_while_executing"])
def test_second_live_delivery_of_one_job_is_skipped(use: Backend, strategy: str, policy: str) -> None:
    queue = DelayingQueue()
    Job = make(strategy, unique_on_conflict=policy, unique_queue=queue)
    assert Job.enqueue(1)
    inner: list[Any] = []
    # the same message delivered again while the first delivery runs (same token, same host):
    # not a duplicate call to raise about or reschedule (it would run twice), just a copy to skip
    Job.probe = lambda: inner.append(deliver(Job)) if not inner else None
    assert deliver(Job) == "done 1"
    assert inner == [None] and Job.ran == [1] and queue.later == []


def test_until_and_while_executing_swaps_locks_atomically(use: Backend) -> None:
    Job = make("until_and_while_executing")
    assert Job.enqueue(1) and Job.enqueue(1) is None
    seen: list[Any] = []

    def probe() -> None:
        state = use.read(Job.lock_key(1))
        seen.append((state.queue, state.run is not None))
        seen.append(Job.enqueue(1))  # the queue lock is free again...
        seen.append(deliver(Job, 1))  # ...but the new job cannot run while this one does

    Job.probe = probe
    assert deliver(Job, 0) == "done 1"
    assert seen == [(None, True), "job-2", None]
    assert Job.ran == [1]
    assert use.read(Job.lock_key(1)).free  # the refused job dropped its own queue lock


def test_until_expired_outlives_perform() -> None:
    clock = FakeClock()
    uniqjob.configure(MemoryBackend(clock=clock))
    Job = make("until_expired", unique_lock_autoexpire=60)
    assert Job.enqueue(1)
    assert deliver(Job) == "done 1"
    assert Job.enqueue(1) is None  # perform did not release it
    clock.advance(61)
    assert Job.enqueue(1)


def test_lock_limit_per_key(use: Backend) -> None:
    Job = make("until_executed", unique_lock_limit=3)
    assert all(Job.enqueue(1) for _ in range(3))
    assert Job.enqueue(1) is None  # the fourth is the conflict
    assert Job.is_locked(1)
    assert all(Job.enqueue(2) for _ in range(3))  # another key has its own three
    assert deliver(Job, 1) == "done 1"  # one finishes...
    assert not Job.is_locked(1)
    assert Job.enqueue(1)  # ...and its slot is free
    assert Job.enqueue(1) is None


def test_lock_limit_while_executing(use: Backend) -> None:
    Job = make("while_executing", unique_lock_limit=2)
    for _ in range(3):
        assert Job.enqueue(1)
    inner: list[Any] = []

    def probe() -> None:
        depth = len(inner)
        inner.append(depth)
        if depth == 0:
            inner.append(deliver(Job, 1))  # a second run, in the second slot
        elif depth == 1:
            inner.append(deliver(Job, 2))  # a third while two run: dropped

    Job.probe = probe
    assert deliver(Job, 0) == "done 1"
    assert inner == [0, 1, None, "done 1"]
    assert Job.ran == [1, 1]


def test_reschedule_through_the_queue(use: Backend) -> None:
    queue = DelayingQueue()
    Job = make(
        "until_executed", unique_on_conflict="reschedule", unique_reschedule_delay=7, unique_queue=queue
    )
    assert Job.enqueue(1)
    assert Job.enqueue(1) is None
    assert queue.later == [((1,), 7.0)]


def test_reschedule_at_execution_time(use: Backend) -> None:
    queue = DelayingQueue()
    Job = make("while_executing", unique_on_conflict="reschedule", unique_queue=queue)
    assert Job.enqueue(1) and Job.enqueue(1)
    Job.probe = lambda: deliver(Job, 1) if not queue.later else None
    assert deliver(Job, 0) == "done 1"
    assert queue.later == [((1,), 5.0)] and Job.ran == [1]


def test_reschedule_inline_waits_and_retries(use: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    class Inline(UniqueJob):
        unique_on_conflict = "reschedule"
        unique_reschedule_delay = 2

        def perform(self, n: int) -> str:
            return "ran"

    holder = Inline.lock(1)
    assert holder.acquire(run=True)
    waits: list[float] = []

    def fake_sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:
            holder.release()

    monkeypatch.setattr(_job_base, "_sleep", fake_sleep)
    assert Inline.run(1) == "ran"
    assert waits == [2, 2, 2]


def test_execution_conflict_under_raise(use: Backend) -> None:
    Job = make("while_executing", unique_on_conflict="raise")
    assert Job.enqueue(1) and Job.enqueue(1)
    errors: list[JobNotUnique] = []

    def probe() -> None:
        try:
            deliver(Job, 1)
        except JobNotUnique as exc:
            errors.append(exc)

    Job.probe = probe
    deliver(Job, 0)
    assert len(errors) == 1 and errors[0].holder["pid"] > 0


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"unique_strategy": "until_done"}, "unique_strategy must be one of until_executed"),
        ({"unique_strategy": "until_expired"}, "'until_expired' needs unique_lock_autoexpire"),
        ({"unique_lock_limit": 0}, "unique_lock_limit must be a whole number >= 1"),
        ({"unique_lock_limit": 2.5}, "unique_lock_limit must be a whole number >= 1"),
        ({"unique_reschedule_delay": -1}, "unique_reschedule_delay must be seconds >= 0"),
        (
            {"unique_on_conflict": "reschedule", "unique_queue": RecordingQueue()},
            "'reschedule', but RecordingQueue cannot delay jobs",
        ),
        ({"unique_queue": object()}, "unique_queue must be a uniqjob.Queue"),
    ],
)
def test_bad_strategy_settings(attrs: dict[str, Any], message: str) -> None:
    def perform(self: Any, n: int) -> None:
        pass

    with pytest.raises(ConfigurationError, match=message):
        type("Bad", (UniqueJob,), {"perform": perform, **attrs})


def test_queue_base_without_push_later_is_rejected_only_for_reschedule() -> None:
    class Plain(Queue):
        pass

    type("Fine", (UniqueJob,), {"unique_queue": Plain(), "perform": lambda self: None})


def test_after_dequeue_frees_one_slot(use: Backend) -> None:
    Job = make("until_executed", unique_lock_limit=2)
    assert Job.enqueue(1) and Job.enqueue(1)
    assert Job.is_locked(1)
    assert Job.after_dequeue(1)
    assert not Job.is_locked(1)
    assert Job.after_dequeue(1)
    assert not Job.after_dequeue(1)
