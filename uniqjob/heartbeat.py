"""One heartbeat thread per process that renews the leases of running jobs.

A thread per job would cost a thread start on every perform; one scheduler
thread with a heap of due times costs a heap push. The thread is started on
first use and again in a forked child (the parent's thread does not survive
``fork``, and RQ forks a work horse per job).

The thread is woken only when a new beat falls due before the time it sleeps
until. A short job's beat is cancelled long before it is due; waking the
thread for it anyway would make it fight the job for the GIL on every perform.
So cancelled beats stay in the heap, and the thread sleeps until they come up,
until they are half of it: then it is rebuilt without them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
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
    owner: Heartbeat | None = field(default=None, repr=False)

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            if self.owner is not None:
                self.owner._cancelled_one()


class Heartbeat:
    """A scheduler thread that calls each :class:`Beat`'s ``renew`` when it falls due."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, Beat]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._wake_at = -math.inf  # when the sleeping thread wakes by itself; -inf: it is not asleep
        self._cancelled = 0  # cancelled beats still in the heap, about
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._heap = []
        self._cond = threading.Condition()
        self._thread = None
        self._wake_at = -math.inf
        self._cancelled = 0

    def start(self, renew: Callable[[], bool], interval: float, name: str = "") -> Beat:
        """Call ``renew`` every ``interval`` seconds from now on, until the beat is cancelled."""
        beat = Beat(renew, interval, name, owner=self)
        with self._cond:
            due = self.clock() + interval
            heapq.heappush(self._heap, (due, next(self._seq), beat))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="uniqjob-heartbeat", daemon=True)
                self._thread.start()
            elif due < self._wake_at:
                self._cond.notify()
        return beat

    def _cancelled_one(self) -> None:
        self._cancelled += 1
        if self._cancelled > 256 and 2 * self._cancelled > len(self._heap):
            with self._cond:
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def _sleep(self, cond: threading.Condition, seconds: float) -> None:
        self._wake_at = self.clock() + seconds
        try:
            cond.wait(seconds)
        finally:
            self._wake_at = -math.inf

    def _loop(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while True:
                    if not self._heap:
                        self._sleep(cond, 60.0)
                        if not self._heap:
                            self._thread = None
                            return  # idle: the next start() makes a new thread
                        continue
                    due = self._heap[0][0] - self.clock()
                    if due > 0:
                        # Even for a cancelled beat: sleeping until it is due, rather than
                        # dropping it at once, spares the wake-up a newer beat would need.
                        self._sleep(cond, due)
                        continue
                    _, _, beat = heapq.heappop(self._heap)
                    if not beat.cancelled:
                        break
                    self._cancelled = max(0, self._cancelled - 1)
            self._beat(beat)

    def _beat(self, beat: Beat) -> None:
        try:
            mine = beat.renew()
        except Exception as exc:  # a store outage must not kill the thread that serves every job
            # One line per failure: during an outage every job's beat fails each second.
            log.warning("heartbeat of %s failed (%s); retrying", beat.name, exc)
            mine = True
            retry = min(beat.interval, 1.0)
        else:
            retry = beat.interval
        if not mine and beat.cancelled:
            return  # the job released its lock while this renewal was on its way: nothing lost
        if not mine:
            log.warning("lost the run lock of %s: another holder took it over", beat.name)
            beat.lost.set()
            return
        with self._cond:
            if not beat.cancelled:
                heapq.heappush(self._heap, (self.clock() + retry, next(self._seq), beat))


#: The process-wide heartbeat used by jobs.
heartbeat = Heartbeat()
