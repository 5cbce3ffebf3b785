"""One heartbeat thread per process that renews the leases of running jobs.

A thread per job would cost a thread start on every perform; one scheduler
thread with a heap of due times costs a heap push. The thread is started on
first use and again in a forked child (the parent's thread does not survive
``fork``, and RQ forks a work horse per job).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Beat", "Heartbeat", "heartbeat"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Beat:
    """One registered lease: ``renew`` is called every ``interval`` seconds until cancelled.

    ``renew`` returns False when the lock is no longer ours; the beat then stops
    and ``lost`` is set, so the job can see it.
    """

    renew: Callable[[], bool]
    interval: float
    name: str = ""
    lost: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class Heartbeat:
    """A scheduler thread that calls each :class:`Beat`'s ``renew`` when it falls due."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, Beat]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._heap = []
        self._cond = threading.Condition()
        self._thread = None

    def start(self, renew: Callable[[], bool], interval: float, name: str = "") -> Beat:
        """Call ``renew`` every ``interval`` seconds from now on, until the beat is cancelled."""
        beat = Beat(renew, interval, name)
        with self._cond:
            heapq.heappush(self._heap, (self.clock() + interval, next(self._seq), beat))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="uniqjob-heartbeat", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is beat:
                self._cond.notify()
        return beat

    def _loop(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while True:
                    while self._heap and self._heap[0][2].cancelled:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        cond.wait(60.0)
                        if not self._heap:
                            self._thread = None
                            return  # idle: the next start() makes a new thread
                        continue
                    due = self._heap[0][0] - self.clock()
                    if due <= 0:
                        _, _, beat = heapq.heappop(self._heap)
                        break
                    cond.wait(due)
            self._beat(beat)

    def _beat(self, beat: Beat) -> None:
        try:
            mine = beat.renew()
        except Exception:  # a store outage must not kill the thread that serves every job
            log.warning("heartbeat of %s failed; retrying", beat.name, exc_info=True)
            mine = True
            retry = min(beat.interval, 1.0)
        else:
            retry = beat.interval
        if not mine:
            log.warning("lost the run lock of %s: another holder took it over", beat.name)
            beat.lost.set()
            return
        with self._cond:
            if not beat.cancelled:
                heapq.heappush(self._heap, (self.clock() + retry, next(self._seq), beat))


#: The process-wide heartbeat used by jobs.
heartbeat = Heartbeat()
