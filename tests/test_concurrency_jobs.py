"""Concurrency limits on job classes: settings, enqueue, workers, inline waits, and guarantees 1-4 and 6.

Guarantee 5 (a promoter that dies mid-handoff) needs a process to die: it is
in ``test_concurrency_procs.py``, with the races between real processes.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from functools import partialmethod
from pathlib import Path
from typing import Any

import pytest

import uniqjob
from tests.concurrency_jobs import (
    QUEUE,
    RAN,
    AnyKey,
    Delayed,
    Discarding,
    Flaky,
    Inline,
    InlineTimeout,
    Limited,
    Raising,
    RecordingQueue,
    Stuck,
    StuckQueue,
)
from tests.conftest import STORES, FakeClock, make_store
from uniqjob import UniqueJob
from uniqjob.concurrency import Park, Parked, Promotion, Semaphore, discard_parked, store_for, sweep
from uniqjob.concurrency._courier import Courier
from uniqjob.concurrency._settings import key_of
from uniqjob.concurrency.semaphore import courier
from uniqjob.errors import ConcurrencyLimitExceeded, ConfigurationError, UniqueKeyError, UnstorableCallError
from uniqjob.integrations import perform
from uniqjob.locks import Holder, local_holder
from uniqjob.stores.base import Backend
from uniqjob.stores.memory import MemoryBackend


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    QUEUE.pushed.clear()
    QUEUE.fail = False
    QUEUE.ids = 0
    RAN.clear()
    yield
    QUEUE.pushed.clear()


@pytest.fixture(params=list(STORES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each store in turn, as the process-wide default."""
    backend = make_store(request, tmp_path)
    uniqjob.configure(backend)
    return backend


@pytest.fixture
def fake_time(clock: FakeClock) -> MemoryBackend:
    backend = MemoryBackend(clock=clock)
    uniqjob.configure(backend)
    return backend


def dead_holder() -> Holder:
    """A holder on this host whose process has exited."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    me = local_holder()
    return Holder(me.host, me.node, proc.pid, 1)


def runs(name: str = "Limited") -> list[Any]:
    return [value for job, value in RAN if job == name]


# -- settings ------------------------------------------------------------------------------


def _define(**attrs: Any) -> type[UniqueJob]:
    def perform(self: Any, n: int) -> None: ...

    return type("Bad", (UniqueJob,), {"perform": perform, "__module__": __name__, **attrs})


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"concurrency_limt": 2}, "concurrency_limt is not a uniqjob setting"),
        ({"concurrency_limit": 0}, "concurrency_limit must be a whole number >= 1"),
        ({"concurrency_limit": True}, "concurrency_limit must be a whole number >= 1"),
        ({"concurrency_limit": "2"}, "concurrency_limit must be a whole number >= 1"),
        ({"concurrency_limit": 1, "concurrency_duration": 0}, "concurrency_duration must be positive"),
        ({"concurrency_limit": 1, "concurrency_duration": "1h"}, "concurrency_duration must be a number"),
        ({"concurrency_limit": 1, "concurrency_on_conflict": "wait"}, "must be one of block, discard, raise"),
        (
            {"concurrency_limit": 1, "concurrency_wait_timeout": -1},
            "concurrency_wait_timeout must be positive",
        ),
        (
            {"concurrency_limit": 1, "concurrency_key": lambda self, n: n},
            "concurrency_key must be a classmethod",
        ),
        ({"concurrency_duration": 60}, "concurrency_duration has no effect without concurrency_limit"),
    ],
)
def test_bad_settings_fail_when_the_class_is_defined(attrs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        _define(**attrs)


def test_good_settings_and_switching_a_limit_off_in_a_subclass() -> None:
    from datetime import timedelta

    limited = _define(concurrency_limit=3, concurrency_duration=timedelta(minutes=5))
    assert limited.semaphore(1).lease == 300.0
    unlimited: type[UniqueJob] = type("Off", (limited,), {"concurrency_limit": None, "__module__": __name__})
    assert unlimited.concurrency_limit is None
    with pytest.raises(ConfigurationError, match="has no concurrency_limit"):
        unlimited.semaphore(1)


def test_the_lease_is_floored_at_two_heartbeats() -> None:
    short = _define(concurrency_limit=1, concurrency_duration=1, unique_run_lease=30)
    semaphore = short.semaphore(1)
    assert (semaphore.interval, semaphore.lease) == (10.0, 20.0)


def test_concurrency_keys() -> None:
    assert key_of(Limited, (7,), {}) == "tests.concurrency_jobs.Limited:order-7"
    assert key_of(Inline, (1,), {}) == "tests.concurrency_jobs.Inline"  # default: one per class
    assert key_of(AnyKey, (1,), {}).startswith("tests.concurrency_jobs.AnyKey:#")
    assert key_of(AnyKey, (1,), {}) != key_of(AnyKey, ("1",), {})  # typed, like lock keys
    for odd in ("#1", "x" * 201, "tab\there", ""):
        assert ":#" in key_of(AnyKey, (odd,), {})
    with pytest.raises(UniqueKeyError, match=r"concurrency_key\(\)"):
        key_of(AnyKey, (object(),), {})


# -- enqueue and workers ---------------------------------------------------------------------


def test_enqueue_takes_slots_then_parks_and_workers_run_everything_in_order(store: Backend) -> None:
    handles = [Limited.enqueue(1, n) for n in range(5)]
    assert handles[:2] == ["job-1", "job-2"]
    assert [h.position for h in handles[2:] if isinstance(h, Parked)] == [1, 2, 3]
    assert len(QUEUE.pushed) == 2
    # parked calls keep their uniqueness lock: a duplicate is still refused
    assert Limited.is_locked(1, 4)
    assert Limited.enqueue(1, 4) is None
    assert QUEUE.work() == [0, 1, 2, 3, 4]
    assert runs() == [(1, n) for n in range(5)]
    assert list(store_for(store).scan()) == []
    assert list(store.scan()) == []


def test_a_parked_call_records_no_job_id_so_no_queue_can_call_it_gone(store: Backend) -> None:
    Limited.enqueue(1, 0)
    Limited.enqueue(1, 1)
    parked = Limited.enqueue(1, 2)
    assert isinstance(parked, Parked)
    queue_lock = store.read(Limited.lock_key(1, 2)).queue
    assert queue_lock is not None and queue_lock.meta.job_id == ""


def test_discard_drops_the_call_and_its_uniqueness_lock(
    store: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    assert Discarding.enqueue(1) == "job-1"
    assert QUEUE.ids == 1
    with caplog.at_level(logging.INFO, logger="uniqjob"):
        assert Discarding.enqueue(2) is None
    assert "at its limit of 1" in caplog.text
    assert not Discarding.is_locked(2)
    QUEUE.work()
    assert Discarding.enqueue(2) == f"job-{QUEUE.ids}"
    assert runs("Discarding") == [1]


def test_raise_refuses_with_the_key_and_limit(store: Backend) -> None:
    Raising.enqueue(1)
    with pytest.raises(ConcurrencyLimitExceeded) as info:
        Raising.enqueue(2)
    assert (info.value.key, info.value.limit) == ("tests.concurrency_jobs.Raising", 1)
    assert not Raising.is_locked(2)


def test_unstorable_arguments_fail_at_enqueue_even_with_a_free_slot(store: Backend) -> None:
    conn = OrderedDict(dsn="db")  # fine in a lock key, yet an OrderedDict would come back a dict
    with pytest.raises(UnstorableCallError, match=r"kwargs\['conn'\]"):
        Limited.enqueue(1, 0, conn=conn)
    assert not Limited.is_locked(1, 0, conn=conn)
    assert Limited.semaphore(1).read().empty


def test_a_failed_push_frees_the_slot_and_the_lock(store: Backend) -> None:
    QUEUE.fail = True
    with pytest.raises(ConnectionError):
        Limited.enqueue(1, 0)
    assert Limited.semaphore(1).read().empty
    assert not Limited.is_locked(1, 0)


def test_a_slot_that_lapsed_in_the_queue_is_taken_again_or_parked(
    fake_time: MemoryBackend, clock: FakeClock
) -> None:
    Limited.enqueue(1, 0)
    Limited.enqueue(1, 1)
    clock.advance(61)  # both sat in their queue longer than concurrency_duration
    Limited.enqueue(1, 2)  # takes a lapsed slot
    Limited.enqueue(1, 3)
    # jobs 0 and 1 start at last: their slots are gone and the key is full, so they park again,
    # and are pushed again when their turn comes
    assert QUEUE.work() == [None, None, 2, 3, 0, 1]
    assert runs() == [(1, 2), (1, 3), (1, 0), (1, 1)]


def test_a_delayed_jobs_slot_lease_covers_its_delay(fake_time: MemoryBackend, clock: FakeClock) -> None:
    Delayed.enqueue(1)
    clock.advance(3600)  # an hour in its queue, longer than concurrency_duration: still its slot
    (slot,) = Delayed.semaphore(1).read().slots
    assert 0 < slot.lease_left <= 60
    assert isinstance(Delayed.enqueue(2), Parked)


def test_the_lease_of_a_running_job_is_renewed_while_it_runs(fake_time: MemoryBackend) -> None:
    semaphore = Limited.semaphore(1)
    assert semaphore.acquire("t", running=True).status == "taken"
    with semaphore.running("t") as hold:
        assert hold.beat is not None and hold.beat.interval == Limited.unique_run_lease / 3
        assert semaphore.renew("t")
    assert semaphore.read().empty


# -- inline ----------------------------------------------------------------------------------


def _start_in_order(threads: list[threading.Thread], semaphore: Semaphore) -> None:
    """Start each thread once the previous one has parked or begun, so the parking order is known."""
    for n, thread in enumerate(threads, 1):
        thread.start()
        deadline = time.monotonic() + 10
        while semaphore.read().parked + len(runs("Inline+")) < n:
            assert time.monotonic() < deadline, "thread never parked"
            time.sleep(0.002)


def test_inline_block_waits_in_this_process_one_at_a_time_first_in_first_out(store: Backend) -> None:
    threads = [threading.Thread(target=Inline.run, args=(n, 0.02)) for n in range(4)]
    _start_in_order(threads, Inline.semaphore(0))
    for thread in threads:
        thread.join(20)
    assert [job for job, _ in RAN] == ["Inline+", "Inline-"] * 4  # never two at once
    assert runs("Inline+") == [0, 1, 2, 3]  # in the order they parked
    assert Inline.semaphore(0).read().empty


def test_inline_block_gives_up_after_its_timeout(store: Backend) -> None:
    release = threading.Event()
    holder = threading.Thread(target=InlineTimeout.run, args=(1, release))
    holder.start()
    semaphore = InlineTimeout.semaphore(1)
    while not semaphore.read().slots:
        time.sleep(0.005)
    began = time.monotonic()
    with pytest.raises(ConcurrencyLimitExceeded, match=r"gave up after waiting 0\.2s"):
        InlineTimeout.run(2)
    assert 0.15 < time.monotonic() - began < 5
    assert semaphore.read().parked == 0  # it withdrew its place
    assert not InlineTimeout.is_locked(2)
    release.set()
    holder.join(10)


def test_an_inline_waiter_whose_place_lapsed_says_so(
    fake_time: MemoryBackend,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Semaphore, "wait", partialmethod(Semaphore.wait, clock=clock))
    semaphore = Inline.semaphore(0)
    assert semaphore.acquire("holder", running=True).status == "taken"
    result: list[Any] = []
    waiter = threading.Thread(target=lambda: result.append(Inline.run(1)))
    with caplog.at_level(logging.WARNING, logger="uniqjob"):
        waiter.start()
        while semaphore.read().parked < 1:
            time.sleep(0.005)
        clock.advance(semaphore.lease + 1)  # as if this process had been suspended for a lease
        waiter.join(10)
    assert result == [None]
    assert "did not poll for a whole lease" in caplog.text
    assert "discarded" not in caplog.text
    assert not Inline.is_locked(1)
    assert runs("Inline+") == []


def test_an_inline_waiter_whose_place_is_discarded_returns_none(
    store: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    semaphore = Inline.semaphore(0)
    assert semaphore.acquire("holder", running=True).status == "taken"
    result: list[Any] = []
    waiter = threading.Thread(target=lambda: result.append(Inline.run(1)))
    with caplog.at_level(logging.WARNING, logger="uniqjob"):
        waiter.start()
        while semaphore.read().parked < 1:
            time.sleep(0.005)
        assert len(semaphore.store.discard_parked(semaphore.key)) == 1
        waiter.join(10)
    assert result == [None]
    assert "is gone: an operator discarded it" in caplog.text
    assert runs("Inline+") == []


# -- the guarantees ----------------------------------------------------------------------------


def test_guarantee_1_a_parked_job_never_ages_out(fake_time: MemoryBackend, clock: FakeClock) -> None:
    Limited.enqueue(1, 0)
    Limited.enqueue(1, 1)
    assert isinstance(Limited.enqueue(1, 2), Parked)
    QUEUE.pushed.clear()  # the two holders' jobs are lost by their queue: their slots lapse
    clock.advance(30 * 24 * 3600)
    assert sweep() == 0
    # a month later the lapsed slots went, and the parked job got one of them: promoted, not expired
    state = Limited.semaphore(1).read()
    assert state.parked == 0 and [s.status for s in state.slots] == ["reserved"]
    assert QUEUE.work() == [2]
    # with nobody to promote it, only an operator's discard takes it away
    Limited.enqueue(1, 3)
    Limited.enqueue(1, 4)
    Limited.enqueue(1, 5)
    clock.advance(365 * 24 * 3600)
    semaphore = Limited.semaphore(1)
    assert discard_parked(semaphore.key) == 1
    assert not Limited.is_locked(1, 5)  # its uniqueness lock went with it


def test_guarantee_2_a_promotion_takes_the_finishers_slot(store: Backend) -> None:
    semaphore = Limited.semaphore(1)
    for n in range(4):
        Limited.enqueue(1, n)
    assert [s.status for s in semaphore.read().slots] == ["reserved", "reserved"]
    _, key, token, args, kwargs = QUEUE.pushed.pop(0)
    Limited.execute(Limited.lock_from(key, token), args, kwargs)
    # the finisher's slot went to the oldest parked job, pushed to the queue in the same breath
    state = semaphore.read()
    assert len(state.slots) == 2 and state.parked == 1
    assert [p[3] for p in QUEUE.pushed] == [(1, 1), (1, 2)]
    assert token not in {s.token for s in state.slots}


def _crashed_holders(semaphore: Semaphore, n: int) -> None:
    dead = dead_holder()
    for k in range(n):
        outcome = semaphore.store.acquire(
            semaphore.key, f"crashed-{k}", limit=semaphore.limit, lease=600, running=True, holder=dead,
            park=None, job_class="", args="", caller=dead,
        )  # fmt: skip
        assert outcome.status == "taken"


def test_guarantee_2_a_call_that_parks_behind_dead_holders_reclaims_their_slots(store: Backend) -> None:
    semaphore = Limited.semaphore(1)
    _crashed_holders(semaphore, 2)
    assert isinstance(Limited.enqueue(1, 0), Parked)  # parked first (FIFO), then promoted at once
    assert [p[3] for p in QUEUE.pushed] == [(1, 0)]
    assert len(semaphore.read().slots) == 1


def test_guarantee_2_a_sweep_promotes_behind_dead_holders_never_past_the_limit(store: Backend) -> None:
    semaphore = Limited.semaphore(1)
    from uniqjob.concurrency.codec import encode_call

    _crashed_holders(semaphore, 2)
    for n in range(3):  # parked straight in the store: nothing has looked at the holders yet
        park = Park("queue", encode_call(Limited, (1, n), {}, Limited.lock_key(1, n)))
        outcome = semaphore.store.acquire(
            semaphore.key, f"parked-{n}", limit=2, lease=60, running=False, holder=None, park=park,
            job_class="", args="", caller=local_holder(),
        )  # fmt: skip
        assert outcome.status == "parked"
    # nothing touches the key; a sweep (cron, a worker's periodic task) proves the holders dead
    assert sweep() == 2
    assert [p[3] for p in QUEUE.pushed] == [(1, 0), (1, 1)]
    state = semaphore.read()
    assert len(state.slots) == 2 and state.parked == 1


def test_guarantee_3_a_job_parked_while_the_holder_finishes_is_promoted(store: Backend) -> None:
    """Threads hammer one key with limit 1: every park races a finish; none may be stranded."""
    threads, calls = 4, 15
    errors: list[BaseException] = []

    def hammer(offset: int) -> None:
        try:
            for n in range(calls):
                Inline.run(offset + n)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=hammer, args=(t * 1000,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert not errors
    assert len(runs("Inline+")) == threads * calls  # every call ran: nobody stranded in the list
    assert [job for job, _ in RAN] == ["Inline+", "Inline-"] * threads * calls  # one at a time
    assert Inline.semaphore(0).read().empty


def test_guarantee_4_a_duplicate_delivery_never_releases_a_slot_twice(store: Backend) -> None:
    semaphore = Limited.semaphore(1)
    Limited.enqueue(1, 0)
    Limited.enqueue(1, 1)
    (_, key_a, token_a, args_a, _), (_, _, token_b, _, _) = QUEUE.pushed
    # the first delivery of job A runs; a second delivery of it arrives meanwhile
    assert semaphore.start(token_a).status == "run"
    duplicate = Limited.lock_from(key_a, token_a)
    assert Limited.execute(duplicate, args_a, {}) is None  # skipped: a copy is running
    duplicate.release()  # what an integration does after a delivery: must free nothing
    assert Limited.is_locked(*args_a)
    assert sorted(s.token for s in semaphore.read().slots) == sorted([token_a, token_b])
    # A finishes and releases once; a late copy releases nothing more: B keeps its slot
    assert semaphore.release(token_a)
    assert not semaphore.release(token_a)
    assert [s.token for s in semaphore.read().slots] == [token_b]
    assert runs() == []


def test_guarantee_6_promotion_is_first_in_first_out_per_key(store: Backend) -> None:
    for n in range(6):
        Limited.enqueue(1, n)
        Limited.enqueue(2, n)
    # finish in a scrambled order: the promotions still follow each key's enqueue order
    QUEUE.pushed.reverse()
    QUEUE.work()
    assert [n for order, n in runs() if order == 1][2:] == [2, 3, 4, 5]
    assert [n for order, n in runs() if order == 2][2:] == [2, 3, 4, 5]


def test_a_promoter_that_cannot_push_leaves_the_job_for_the_next_settle(
    fake_time: MemoryBackend, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    semaphore = Limited.semaphore(1)
    for n in range(3):
        Limited.enqueue(1, n)
    QUEUE.fail = True
    _, key, token, args, kwargs = QUEUE.pushed.pop(0)
    with caplog.at_level(logging.ERROR, logger="uniqjob"):
        assert Limited.execute(Limited.lock_from(key, token), args, kwargs) == 0  # the job's own result
    assert "could not hand parked job" in caplog.text
    assert [s.status for s in semaphore.read().slots].count("promoted") == 1
    QUEUE.fail = False
    clock.advance(31)  # the handoff time passed: the next settle pushes it again
    sweep()
    assert [p[3] for p in QUEUE.pushed] == [(1, 1), (1, 2)]


def test_a_parked_call_of_a_class_that_lost_its_queue_is_logged(
    store: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    semaphore = Limited.semaphore(1)
    promoted = semaphore.store.acquire(
        semaphore.key, "x", limit=0, lease=60, running=False, holder=None, job_class="", args="",
        park=Park("queue", '{"format": 1, "class": "tests.concurrency_jobs:Inline", "lock": "k"}'),
        caller=local_holder(),
    )  # fmt: skip
    assert promoted.status == "parked"
    with caplog.at_level(logging.ERROR, logger="uniqjob"):
        Limited.enqueue(1, 0)  # limit 2 again: the settle promotes x, whose class has no queue
    assert "has no unique_queue" in caplog.text


# -- retries, job ids, jobs gone from their queue -------------------------------------------------


def _deliver(queue: RecordingQueue, retry_in: float | None = None) -> Any:
    """Run the oldest pushed job as a queue integration does; ``retry_in``: the queue retries a failure."""
    job_cls, key, token, args, kwargs = queue.pushed.pop(0)
    return perform(
        job_cls, job_cls.lock_from(key, token), args, kwargs, lambda exc, _: retry_in if exc else None
    )


def test_a_retried_job_keeps_its_slot_and_its_retry_runs_in_it(store: Backend) -> None:
    Flaky.attempts.clear()
    Flaky.enqueue(1)
    assert isinstance(Flaky.enqueue(2), Parked)
    semaphore = Flaky.semaphore(1)
    _, _, token, _, _ = QUEUE.pushed[0]
    retry = QUEUE.pushed[0]
    with pytest.raises(RuntimeError, match="attempt 1 of 1 fails"):
        _deliver(QUEUE, retry_in=30.0)
    # the queue will run job 1 again: it keeps its slot while it waits (job 2 stays parked)
    state = semaphore.read()
    assert [(s.token, s.status) for s in state.slots] == [(token, "reserved")]
    assert 60 < state.slots[0].lease_left <= 90  # concurrency_duration plus the retry's delay
    assert state.parked == 1 and QUEUE.pushed == []
    QUEUE.pushed.append(retry)  # the queue delivers the retry
    assert _deliver(QUEUE) == 1
    assert runs("Flaky") == [(1, 1), (1, 2)]
    assert [p[3] for p in QUEUE.pushed] == [(2,)]  # only now is job 2 promoted
    assert not Flaky.is_locked(1)


def test_a_retry_of_a_job_pushed_twice_runs_and_its_late_copy_does_not(
    fake_time: MemoryBackend, clock: FakeClock
) -> None:
    Flaky.attempts.clear()
    Flaky.enqueue(1)
    assert isinstance(Flaky.enqueue(2), Parked)
    QUEUE.fail = True  # the promoter cannot push job 2 when job 1 ends
    Flaky.attempts[1] = 1  # job 1 succeeds at once
    _deliver(QUEUE)
    QUEUE.fail = False
    clock.advance(31)  # the handoff passed: the next settle pushes job 2 again
    sweep()
    copy = QUEUE.pushed[0]  # the first push may have reached the broker after all: a late copy
    with pytest.raises(RuntimeError, match="attempt 1 of 2 fails"):
        _deliver(QUEUE, retry_in=10.0)
    QUEUE.pushed.append(copy)  # the retry
    assert _deliver(QUEUE) == 2  # runs: the job is not done yet
    QUEUE.pushed.append(copy)  # the late copy
    assert _deliver(QUEUE) is None  # skipped: job 2 is done
    assert runs("Flaky") == [(1, 2), (2, 1), (2, 2)]
    assert not Flaky.is_locked(2)
    assert Flaky.semaphore(2).read().empty


def test_a_promoted_job_records_its_queue_job_id_so_its_queue_can_call_it_gone(
    store: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(3):
        Limited.enqueue(1, n)
    QUEUE.work(limit=1)  # job 0 ends: job 2 is promoted and pushed
    assert [p[3] for p in QUEUE.pushed] == [(1, 1), (1, 2)]
    queue_lock = store.read(Limited.lock_key(1, 2)).queue
    assert queue_lock is not None and queue_lock.meta.job_id == "job-3"  # ids 1, 2 went to jobs 0, 1
    # the queue loses job 2: the next enqueue of it reclaims its lock, and its slot with it
    QUEUE.pushed.pop()
    monkeypatch.setattr(QUEUE, "job_gone", lambda job_id: job_id == "job-3")
    assert Limited.enqueue(1, 2) == "job-4"  # a slot at once, not parked behind its own lost copy
    assert len(Limited.semaphore(1).read().slots) == 2


# -- the courier: promotions found by the heartbeat ----------------------------------------------


@pytest.mark.slow
def test_a_hung_promotion_push_never_stalls_the_heartbeat(
    fake_time: MemoryBackend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = Stuck.unique_queue
    assert isinstance(queue, StuckQueue)
    queue.pushed.clear()
    queue.entered.clear()
    queue.unstick.clear()
    semaphore = Stuck.semaphore(0)
    store = semaphore.store
    renewals: list[float] = []
    renew = store.renew

    def counted(*args: Any, **kwargs: Any) -> Any:
        renewals.append(time.monotonic())
        return renew(*args, **kwargs)

    monkeypatch.setattr(store, "renew", counted)
    me = local_holder()
    assert semaphore.acquire("running", running=True).status == "taken"
    lapsing = store.acquire(
        semaphore.key, "lapsing", limit=2, lease=1.0, running=False, holder=None, park=None,
        job_class="", args="", caller=me,
    )  # fmt: skip
    assert lapsing.status == "taken"
    parked = Stuck.enqueue(7)
    assert isinstance(parked, Parked)
    try:
        with semaphore.running("running"):
            clock.advance(2)  # the next renewal settles the key: frees "lapsing", promotes job 7
            assert queue.entered.wait(10), "the promotion was never pushed"
            seen = len(renewals)
            time.sleep(1.0)  # three heartbeats
            assert len(renewals) >= seen + 2, "the heartbeat waited on the broker"
            queue.unstick.set()
            assert courier.drain(10)
        assert [p[3] for p in queue.pushed] == [(7,)]
        (slot,) = semaphore.read().slots
        assert (slot.token, slot.status) == (parked.token, "reserved")  # pushed and handed
    finally:
        queue.unstick.set()


def test_the_courier_queues_a_promotion_once_while_its_push_hangs() -> None:
    delivered: list[str] = []
    release = threading.Event()

    def deliver(store: Any, key: str, promotions: Any, caller: Holder) -> None:
        release.wait(10)
        delivered.extend(p.token for p in promotions)

    mine = Courier(deliver)
    store = store_for(MemoryBackend())
    first, second = Promotion("a", "queue", "{}", 0), Promotion("b", "queue", "{}", 0)
    mine.send(store, "k", [first, second], local_holder())
    mine.send(store, "k", [Promotion("b", "queue", "{}", 1)], local_holder())  # claimed again meanwhile
    assert not mine.drain(0.05)
    release.set()
    assert mine.drain(10)
    assert delivered == ["a", "b"]  # in order, each once


# -- inspection --------------------------------------------------------------------------------


def test_inspect_reports_keys_busiest_first_and_true_totals(store: Backend) -> None:
    for order in range(40):  # more keys than the report keeps while it scans
        Limited.enqueue(order, 0)
    for n in range(1, 5):
        Limited.enqueue(7, n)  # order 7: full, three parked
    Limited.enqueue(8, 1)  # order 8: full
    semaphore = Limited.semaphore(9)
    _crashed_holders(semaphore, 1)  # order 9: one live slot in its queue, one stale
    report = uniqjob.ops.concurrency(top=3)
    assert [row.key for row in report.keys] == [
        "tests.concurrency_jobs.Limited:order-7",
        "tests.concurrency_jobs.Limited:order-9",
        "tests.concurrency_jobs.Limited:order-8",
    ]
    busiest = report.keys[0]
    assert (busiest.held, busiest.limit, busiest.parked, busiest.at_limit, busiest.lease) == (
        2,
        2,
        3,
        True,
        "fresh",
    )
    assert busiest.oldest_wait is not None and busiest.oldest_wait >= 0
    assert (report.keys[1].stale, report.keys[1].lease) == (1, "mixed")
    totals = report.totals
    assert (totals.keys, totals.slots_held, totals.stale_slots, totals.keys_at_limit, totals.parked) == (
        40, 43, 1, 3, 3,
    )  # fmt: skip
    assert totals.oldest_wait == busiest.oldest_wait
    assert report.left_out == 37
    assert uniqjob.ops.concurrency(job_class="Inline").totals.keys == 0
    assert uniqjob.ops.concurrency_key("tests.concurrency_jobs.Limited:order-8") == report.keys[2]
    assert uniqjob.ops.concurrency_key("nobody") is None
    assert report.keys[0].to_json()["oldest_wait_s"] == busiest.oldest_wait


def test_inspect_marks_lapsed_leases_stale(fake_time: MemoryBackend, clock: FakeClock) -> None:
    Limited.enqueue(1, 0)
    clock.advance(61)
    (row,) = uniqjob.ops.concurrency().keys
    assert (row.held, row.stale, row.lease) == (1, 1, "stale")  # shown until the next settle frees it
