"""The shared heartbeat: beats on time, woken only when it must be, and knows when a lock may be lost."""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

import uniqjob.heartbeat as heartbeat_module
from tests.conftest import FakeClock
from uniqjob.heartbeat import MARGIN_RATIO, PRESUMED, RETRY, TAKEN, Beat, Heartbeat, margin


def wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class CountingCondition(threading.Condition):
    notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


@pytest.fixture
def beats() -> Iterator[Heartbeat]:
    hb = Heartbeat()
    hb._cond = CountingCondition()
    yield hb
    with hb._cond:
        for _, _, beat in hb._heap:
            beat.cancel()


def counter() -> tuple[list[float], Callable[[], bool]]:
    calls: list[float] = []

    def renew() -> bool:
        calls.append(time.monotonic())
        return True

    return calls, renew


def test_a_beat_renews_until_cancelled(beats: Heartbeat) -> None:
    calls, renew = counter()
    beat = beats.start(renew, 0.01, "k")
    assert wait_for(lambda: len(calls) >= 3)
    beat.cancel()
    seen = len(calls)
    time.sleep(0.05)
    assert len(calls) <= seen + 1  # at most the one already under way


def test_an_earlier_beat_wakes_the_sleeping_thread(beats: Heartbeat) -> None:
    beats.start(lambda: True, 30.0, "slow")
    assert wait_for(lambda: beats._wake_at > 0)  # asleep until the slow beat is due
    calls, renew = counter()
    beats.start(renew, 0.01, "fast")
    assert wait_for(lambda: len(calls) >= 1, 2.0)


def test_short_jobs_do_not_wake_the_thread(beats: Heartbeat) -> None:
    beats.start(lambda: True, 30.0, "job").cancel()
    # asleep until that cancelled beat is due, not idle, so a later beat needs no wake-up
    assert wait_for(lambda: 25 < beats._wake_at - time.monotonic() < 31)
    assert isinstance(beats._cond, CountingCondition)
    before = beats._cond.notified
    for n in range(50):  # short jobs: each beat is cancelled long before it is due
        beats.start(lambda: True, 30.0, f"job {n}").cancel()
    assert beats._cond.notified == before


def test_cancelled_beats_do_not_pile_up(beats: Heartbeat) -> None:
    beats.start(lambda: True, 60.0, "long")
    for n in range(5000):
        beats.start(lambda: True, 60.0, f"job {n}").cancel()
    assert len(beats._heap) < 600


def test_a_lost_lock_stops_its_beat(beats: Heartbeat) -> None:
    calls: list[int] = []

    def renew() -> bool:
        calls.append(1)
        return False  # another holder took the lock over

    beat = beats.start(renew, 0.01, "k")
    assert beat.lost.wait(5)
    time.sleep(0.05)
    assert calls == [1]


def test_a_failing_renew_is_retried(beats: Heartbeat) -> None:
    calls: list[int] = []

    def renew() -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("the store is down")
        return True

    beat = beats.start(renew, 0.01, "k")
    assert wait_for(lambda: len(calls) >= 3)
    assert not beat.lost.is_set()
    beat.cancel()


# -- holder-side lease discipline ----------------------------------------------------------------


@pytest.fixture
def timed(clock: FakeClock) -> Iterator[Heartbeat]:
    """A heartbeat on a fake clock: the test moves time on and wakes the scheduler (see ``advance``)."""
    hb = Heartbeat(clock=clock)
    yield hb
    with hb._cond:
        for _, _, beat in hb._heap:
            beat.cancel()


def advance(hb: Heartbeat, clock: FakeClock, seconds: float) -> None:
    """Move the fake clock on and wake the scheduler, which slept in real time for fake seconds."""
    clock.advance(seconds)
    with hb._cond:
        hb._cond.notify_all()


def settled(hb: Heartbeat) -> bool:
    """True once the scheduler sleeps again and no renewal is under way."""
    with hb._cond:
        return hb._wake_at > -1e300 and not any(beat._busy for _, _, beat in hb._heap)


def test_the_margin_is_a_third_of_the_lease() -> None:
    assert pytest.approx(1 / 3) == MARGIN_RATIO
    assert margin(9.0) == pytest.approx(3.0)


def test_the_deadline_counts_from_the_grant_s_send_time(timed: Heartbeat, clock: FakeClock) -> None:
    granted = clock.now
    clock.advance(0.5)  # the grant's reply took half a second
    beat = timed.start(lambda: True, 3.0, "k", lease=9.0, confirmed=granted)
    assert beat.deadline == pytest.approx(granted + 9.0 - 3.0, abs=1e-6)
    assert not beat.presumed_lost()


def test_a_confirmed_renewal_moves_the_deadline_from_its_send_time(
    timed: Heartbeat, clock: FakeClock
) -> None:
    sent: list[float] = []

    def renew() -> bool:
        sent.append(clock.now)
        clock.advance(1.0)  # the reply takes a second: the store counted from no earlier than the send
        return True

    beat = timed.start(renew, 3.0, "k", lease=9.0, confirmed=clock.now)
    advance(timed, clock, 3.0)
    # (abs: the clock reads 1.8e9, where approx's relative default would accept the first deadline)
    assert wait_for(lambda: bool(sent) and beat.deadline == pytest.approx(sent[0] + 6.0, abs=1e-6))
    assert beat.confirmed == sent[0]
    clock.advance(4.0)  # at 8 s: past the first deadline (6 s), not past the new one (9 s)
    assert not beat.presumed_lost()


def test_a_late_confirmation_leaves_the_reason_counted_to_the_loss(
    timed: Heartbeat, clock: FakeClock
) -> None:
    """A renewal sent at 3 s, confirmed after the loss at 6 s, moves ``confirmed``; the reason keeps 6.0s."""
    started, reply = threading.Event(), threading.Event()

    def renew() -> bool:
        started.set()
        reply.wait(10)
        return True

    beat = timed.start(renew, 3.0, "nightly", lease=9.0, confirmed=clock.now)
    advance(timed, clock, 3.0)
    assert started.wait(10)  # sent at 3 s, its reply held
    clock.advance(3.01)
    assert beat.presumed_lost()
    reply.set()
    assert wait_for(lambda: beat.confirmed > beat.lost_at - 6.0)  # confirmed late: from its send, at 3 s
    assert "no renewal confirmed by the store for 6.0s of its 9s lease" in beat.explain()  # not 3.0s


def test_past_the_deadline_the_lock_is_presumed_lost_when_asked(timed: Heartbeat, clock: FakeClock) -> None:
    # No thread needs to have noticed: asking checks the clock. A renewal the scheduler starts
    # meanwhile (it may wake on a loaded machine) is held until the end: a late confirmation
    # moves ``confirmed``, and explain() would then count from it.
    held = threading.Event()

    def renew() -> bool:
        held.wait(10)
        return True

    beat = timed.start(renew, 3.0, "nightly", lease=9.0, confirmed=clock.now)
    try:
        clock.advance(5.99)
        assert not beat.presumed_lost() and not beat.lost.is_set()
        clock.advance(0.02)
        assert beat.presumed_lost()
        assert beat.lost.is_set() and beat.reason == PRESUMED
        assert "no renewal confirmed by the store for 6.0s of its 9s lease" in beat.explain()
    finally:
        held.set()


def test_failing_renewals_are_retried_every_second_past_the_deadline(
    timed: Heartbeat, clock: FakeClock
) -> None:
    tries: list[float] = []

    def renew() -> bool:
        tries.append(clock.now)
        raise ConnectionError("the store is down")

    start = clock.now
    beat = timed.start(renew, 3.0, "k", lease=9.0, confirmed=start)
    for _ in range(5):  # 3 s to the first renewal, then one try a second
        seen = len(tries)
        advance(timed, clock, 3.0 if not tries else RETRY)
        assert wait_for(partial(_tried_again, tries, seen))
        assert wait_for(lambda: settled(timed))
    # Presumed lost at 6 s (lease 9 less its margin of 3); the tries go on, token-checked,
    # so a perform that does not stop keeps its lock if the store comes back in time.
    assert [t - start for t in tries] == pytest.approx([3.0, 4.0, 5.0, 6.0, 7.0])
    assert beat.lost.is_set() and beat.reason == PRESUMED


def _tried_again(tries: list[float], seen: int) -> bool:
    return len(tries) > seen


def test_a_renewal_confirmed_after_the_deadline_does_not_revive_the_lock(
    timed: Heartbeat, clock: FakeClock
) -> None:
    def renew() -> bool:
        clock.advance(4.0)  # sent in time, confirmed after the deadline
        return True

    beat = timed.start(renew, 3.0, "k", lease=9.0, confirmed=clock.now)
    advance(timed, clock, 3.0)
    assert beat.lost.wait(5)
    assert beat.reason == PRESUMED


def test_a_stalled_renewal_is_presumed_lost_on_time(
    beats: Heartbeat, caplog: pytest.LogCaptureFixture
) -> None:
    # The renewal hangs (a stopped Redis, a socket timeout away): the loss must
    # be noticed at the deadline all the same, by the heartbeat itself.
    stall = threading.Event()
    entered = threading.Event()
    called: list[float] = []

    def renew() -> bool:
        entered.set()
        stall.wait(10)
        return True

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="uniqjob.heartbeat"):
        beat = beats.start(
            renew,
            0.1,
            "nightly",
            lease=1.5,
            confirmed=started,
            on_lost=lambda: called.append(time.monotonic()),
        )
        try:
            assert entered.wait(5)
            assert beat.lost.wait(5)
            assert wait_for(lambda: bool(called))
        finally:
            stall.set()
        time.sleep(0.1)
    # At lease less margin (1 s), before the lease could lapse on the store (1.5 s).
    assert 1.0 <= beat.lost_at - started < 1.5
    assert called[0] - started < 1.5
    assert beat.reason == PRESUMED
    assert called and len(called) == 1
    lines = [r.getMessage() for r in caplog.records if "nightly" in r.getMessage()]
    assert len(lines) == 1 and "presumed the run lock of nightly lost" in lines[0]


def test_a_taken_lock_is_reported_once_and_calls_on_lost(
    beats: Heartbeat, caplog: pytest.LogCaptureFixture
) -> None:
    called = threading.Event()
    with caplog.at_level(logging.WARNING, logger="uniqjob.heartbeat"):
        beat = beats.start(lambda: False, 0.01, "k", lease=3.0, on_lost=called.set)
        assert called.wait(5)
        assert beat.presumed_lost()  # lost is lost, whatever the clock says
    assert beat.reason == TAKEN and "released by force, or expired and taken" in beat.explain()
    assert len([r for r in caplog.records if "lost the run lock of k" in r.getMessage()]) == 1


def test_an_on_lost_that_raises_is_logged_not_raised(
    beats: Heartbeat, caplog: pytest.LogCaptureFixture
) -> None:
    def on_lost() -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.WARNING, logger="uniqjob.heartbeat"):
        beat = beats.start(lambda: True, 30.0, "k", lease=0.3, on_lost=on_lost)
        assert beat.lost.wait(5)
        assert wait_for(lambda: any("on_lost callback of k failed" in r.getMessage() for r in caplog.records))
    assert beats._thread is not None and beats._thread.is_alive()  # the scheduler lives on


def test_a_cancelled_beat_is_never_presumed_lost(timed: Heartbeat, clock: FakeClock) -> None:
    called: list[int] = []
    beat = timed.start(lambda: True, 3.0, "k", lease=9.0, on_lost=lambda: called.append(1))
    beat.cancel()
    advance(timed, clock, 60.0)
    assert not beat.presumed_lost() and not beat.lost.is_set()
    time.sleep(0.05)
    assert called == []


def test_without_a_lease_nothing_is_presumed(timed: Heartbeat, clock: FakeClock) -> None:
    beat = timed.start(lambda: True, 3.0, "k")
    clock.advance(3600.0)
    assert not beat.presumed_lost()
    beat.cancel()


def test_short_jobs_with_a_lease_do_not_wake_the_thread(beats: Heartbeat) -> None:
    beats.start(lambda: True, 10.0, "job", lease=30.0).cancel()
    assert wait_for(lambda: 5 < beats._wake_at - time.monotonic() < 11)
    assert isinstance(beats._cond, CountingCondition)
    before = beats._cond.notified
    for n in range(50):
        beats.start(lambda: True, 10.0, f"job {n}", lease=30.0).cancel()
    assert beats._cond.notified == before
    assert beats._workers == {}  # no renewal fell due: no worker thread either


def test_a_beat_made_by_hand_is_never_presumed() -> None:
    assert not Beat(lambda: True, 1.0, "k").presumed_lost()


def test_a_finished_job_s_lock_is_freed_at_once_not_kept_by_its_cancelled_beat() -> None:
    # A cancelled beat stays in the heap until it would have come due (tens of seconds): it must
    # keep nothing of its job meanwhile, or every short job's objects would outlive it (and, as a
    # reference cycle lock -> beat -> lock, wait for the garbage collector even then).
    from uniqjob import JobLock, MemoryBackend

    gc.disable()
    try:
        lock = JobLock(MemoryBackend(), "k")
        assert lock.acquire()
        with lock.running():
            beat = lock.beat
            assert beat is not None
        freed = weakref.ref(lock)
        del lock
        assert freed() is None
        assert beat.cancelled and not beat.lost.is_set()
    finally:
        gc.enable()


def test_a_reported_loss_calls_on_lost_even_if_the_job_cancels_its_beat_at_once(
    timed: Heartbeat, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The job sees its lock presumed lost and stops at once (cancels its beat) before the
    # thread that runs on_lost has begun: the loss was reported, so on_lost must still run.
    go = threading.Event()
    real = heartbeat_module._call_on_lost

    def after_the_cancel(*args: Any) -> None:
        go.wait(5.0)
        real(*args)

    monkeypatch.setattr(heartbeat_module, "_call_on_lost", after_the_cancel)
    called = threading.Event()
    beat = timed.start(lambda: True, 100.0, "k", lease=9.0, on_lost=called.set)
    clock.advance(7.0)  # past the deadline (9 - 3)
    assert beat.presumed_lost()  # logged, on_lost on its way
    beat.cancel()
    go.set()
    assert called.wait(5.0)
