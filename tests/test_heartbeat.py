"""The shared heartbeat thread: beats on time, woken only when it must be."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from uniqjob.heartbeat import Heartbeat


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
