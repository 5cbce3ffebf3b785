"""One heartbeat per process that renews the leases of running jobs, and knows when one may be lost.

A thread per job would cost a thread start on every perform; one scheduler
thread with a heap of due times costs a heap push. The scheduler is started on
first use and again in a forked child (the parent's threads do not survive
``fork``, and RQ forks a work horse per job).

The scheduler is woken only when a new beat falls due before the time it sleeps
until. A short job's beat is cancelled long before it is due; waking the
thread for it anyway would make it fight the job for the GIL on every perform.
So cancelled beats stay in the heap, and the thread sleeps until they come up,
until they are half of it: then it is rebuilt without them. A cancelled beat
lets go of its job (its ``renew`` and ``on_lost``) at once, and a beat makes
its ``lost`` event only when asked: a short job's objects are freed as it
ends, not kept for a lease by the heap (nor left to the garbage collector).

Renewals are made by worker threads, one per store (``group``), each started
when its first renewal falls due (a short job never needs one). The scheduler
never waits on a store, so it keeps time even while a renewal hangs on a
stalled server for a whole socket timeout: that is what lets it presume a lock
lost on time; and a store that hangs delays no other store's renewals.

Holder-side lease discipline
----------------------------
A beat started with a ``lease`` keeps, on this process's monotonic clock,
``confirmed``: when the request the store last confirmed was *sent* (the grant,
then each successful renew). The store counts the lease from when it
*handled* that request, which is no earlier, so on our clock the lease cannot
lapse before ``confirmed + lease``. Once ``deadline = confirmed + lease -
margin`` passes with no renewal confirmed, the lock is **presumed lost**: the
beat sets ``lost`` (``reason`` ``"presumed"``), logs it once and calls its
``on_lost`` once; the holder then has ``margin`` seconds to stop acting
before anyone else could be given the key. ``margin`` is ``lease *
MARGIN_RATIO`` (a third of the lease; renewals come every third, so one
renewal may fail outright and the next still confirm in time). A failing
renewal is retried every second (``RETRY``). ``lost`` stays set, but the
renewals go on (token-checked: a renewal never takes a lock that is someone
else's), so a perform that does not stop keeps its lock if the store answers
again before the lease lapses; only the store saying that the lock is
another's (``reason`` ``"taken"``) ends them.

This rests on one assumption: the holder's and the store's clocks advance at
about the same rate (a drift far smaller than the margin; real clocks drift by
parts per million). It cannot cover a holder that is itself frozen (SIGSTOP,
a VM pause, a long GC stop) past its lease: a frozen process notices nothing
until it runs again, and may then act once more. Fences are for that: a
resource that records the fence of each write refuses the late one.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .stores._log import get_logger

__all__ = [
    "LOST_RECORD",
    "MARGIN_RATIO",
    "PRESUMED",
    "RETRY",
    "TAKEN",
    "TAKEN_TEXT",
    "Beat",
    "Heartbeat",
    "deadline",
    "heartbeat",
    "margin",
]

log = get_logger(__name__)

#: The safety margin, as a share of the lease: a lock is presumed lost this long before its lease could lapse.
MARGIN_RATIO = 1 / 3

#: Seconds between tries of a renewal that failed (the store did not answer); half an interval if less.
RETRY = 1.0

#: ``Beat.reason`` when the store said the lock is no longer ours (removed by force, or expired and taken).
TAKEN = "taken"
#: Why a :data:`TAKEN` lock is lost, as a phrase. The store only says the token no longer
#: matches: whether the key was deleted (``uniqjob release --force``) or expired and was taken
#: by another holder, it cannot tell.
TAKEN_TEXT = "the store no longer holds it for this holder (released by force, or expired and taken)"
#: ``Beat.reason`` when no renewal was confirmed before the deadline.
PRESUMED = "presumed"

#: Log records of a lost lock carry this attribute (True), so a caller that reports it in its own words can
#: leave it out.
LOST_RECORD = "uniqjob_lost"


def margin(lease: float) -> float:
    """How long before a lease could lapse on the store its holder presumes the lock lost."""
    return lease * MARGIN_RATIO


def deadline(confirmed: float, lease: float) -> float:
    """When a lock whose lease was last confirmed by a request sent at ``confirmed`` is presumed lost."""
    return confirmed + lease - margin(lease)


@dataclass(eq=False, slots=True)
class Beat:
    """One registered lease: ``renew`` is called every ``interval`` seconds until cancelled.

    ``renew`` returns False when the lock is no longer ours, and raises when the store
    fails; ``lost`` is set when the lock is lost or presumed lost (see the module).
    """

    renew: Callable[[], bool]
    interval: float
    name: str = ""
    cancelled: bool = False
    owner: Heartbeat | None = field(default=None, repr=False)
    #: The lease, or None: no presumption, the lock is lost only when the store says so.
    lease: float | None = None
    #: When the request the store last confirmed was sent (monotonic, the owner's clock).
    confirmed: float = -math.inf
    #: When the lock is presumed lost unless a renewal is confirmed first; +inf without a lease.
    deadline: float = math.inf
    #: Why ``lost`` is set: :data:`TAKEN` or :data:`PRESUMED`; "" while it is not.
    reason: str = ""
    #: When ``lost`` was set (owner's clock).
    lost_at: float = math.nan
    #: How long no renewal had been confirmed when it was presumed lost (a late one moves ``confirmed``).
    unconfirmed_for: float = math.nan
    on_lost: Callable[[], None] | None = field(default=None, repr=False)
    due: float = 0.0  # when the next renewal is due
    group: int = 0  # which worker renews it: one per store
    _entry: int = field(default=-1, repr=False)  # the heap entry that stands for this beat; others are stale
    _busy: bool = field(default=False, repr=False)  # a renewal is under way in the worker
    # ``lost``, made when first asked for: a short job's beat (nearly every one) never is.
    _lost: threading.Event | None = field(default=None, repr=False)

    @property
    def lost(self) -> threading.Event:
        """Set when the lock is lost or presumed lost (see ``reason``)."""
        event = self._lost
        if event is None:
            with _MAKING:  # one Event per beat, whichever threads ask first
                event = self._lost
                if event is None:
                    event = self._lost = threading.Event()
        return event

    def _is_lost(self) -> bool:
        event = self._lost
        return event is not None and event.is_set()

    def cancel(self) -> None:
        """Stop renewing (the job is done); a beat cancelled is never reported lost."""
        if not self.cancelled:
            self.cancelled = True
            # The heap keeps a cancelled beat until it comes due (see Heartbeat): it keeps
            # nothing of its job meanwhile, so the job's objects are freed as soon as it ends.
            self.renew, self.on_lost = _renewed, None
            if self.owner is not None:
                self.owner._cancelled_one()

    def _watch(self) -> float:
        """The deadline still to keep: none once the lock is presumed (or known) lost."""
        return math.inf if self._is_lost() else self.deadline

    def presumed_lost(self) -> bool:
        """True if the lock is lost or presumed lost by now, checked against the clock.

        The deadline is checked here too, so a caller asking gets the right
        answer even before the heartbeat's own threads have noticed.
        """
        if self._is_lost():
            return True
        if self.cancelled or self.owner is None or self.owner.clock() < self.deadline:
            return False
        self.owner._presume(self)
        return self._is_lost()

    def explain(self) -> str:
        """Why the lock is lost, as a phrase for a message ("" while it is not)."""
        if self.reason == TAKEN:
            return TAKEN_TEXT
        if self.reason == PRESUMED:
            assert self.lease is not None
            return (
                f"it is presumed lost: no renewal confirmed by the store for "
                f"{self.unconfirmed_for:.1f}s of its {self.lease:g}s lease"
            )
        return ""


class Heartbeat:
    """A scheduler thread that has each :class:`Beat` renewed when it falls due, and keeps its deadline."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # Also after fork, in the child: the parent's threads are not there.
        self._heap: list[tuple[float, int, Beat]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._wake_at = -math.inf  # when the sleeping thread wakes by itself; -inf: it is not asleep
        self._cancelled = 0  # cancelled beats still in the heap, about
        # Per group (a store): the worker's renewals to make, and the worker.
        self._workers: dict[int, tuple[queue.SimpleQueue[Beat | None], threading.Thread]] = {}

    def start(
        self,
        renew: Callable[[], bool],
        interval: float,
        name: str = "",
        *,
        lease: float | None = None,
        confirmed: float | None = None,
        on_lost: Callable[[], None] | None = None,
        group: object = None,
    ) -> Beat:
        """Call ``renew`` every ``interval`` seconds from now on, until the beat is cancelled.

        With ``lease``, the lock is presumed lost ``lease - margin`` after
        ``confirmed`` (this heartbeat's ``clock()`` just before the request that
        granted the lock was sent; default now) unless a renewal is confirmed
        first. ``on_lost`` is called once, on a thread of its own, when the lock
        is lost or presumed lost. Beats of one ``group`` (their store) are
        renewed by one worker thread, so a store that hangs holds up no other.
        """
        now = self.clock()
        beat = Beat(renew, interval, name, owner=self, lease=lease, on_lost=on_lost, due=now + interval)
        beat.group = id(group)
        if lease is not None:
            beat.confirmed = now if confirmed is None else min(confirmed, now)
            beat.deadline = deadline(beat.confirmed, lease)
            # Due one interval after the grant was sent, not after its (maybe slow) reply:
            # else a slow grant's first renewal could fall due after its deadline.
            beat.due = beat.confirmed + interval
        with self._cond:
            self._push(beat, min(beat.due, beat.deadline))
        return beat

    # -- the scheduler ---------------------------------------------------------------

    def _push(self, beat: Beat, at: float) -> None:
        """Have the scheduler look at ``beat`` at ``at`` (its one live entry from now on). Lock held."""
        seq = next(self._seq)
        beat._entry = seq
        heapq.heappush(self._heap, (at, seq, beat))
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="uniqjob-heartbeat", daemon=True)
            self._thread.start()
        elif at < self._wake_at:
            self._cond.notify()

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
                beat = self._next(cond)
                if beat is None:
                    return
                lost = self._visit(beat)
            if lost:
                self._report(beat)

    def _next(self, cond: threading.Condition) -> Beat | None:
        """Wait for the next live entry to come due and pop its beat; None when idle for a minute."""
        while True:
            if not self._heap:
                self._sleep(cond, 60.0)
                if not self._heap:
                    for todo, _thread in self._workers.values():
                        todo.put(None)  # each worker ends once it has made the renewals it was given
                    self._workers = {}
                    self._thread = None
                    return None  # idle: the next start() makes a new thread
                continue
            due = self._heap[0][0] - self.clock()
            if due > 0:
                # Even for a cancelled beat: sleeping until it is due, rather than
                # dropping it at once, spares the wake-up a newer beat would need.
                self._sleep(cond, due)
                continue
            _, seq, beat = heapq.heappop(self._heap)
            if beat.cancelled:
                self._cancelled = max(0, self._cancelled - 1)
            elif seq == beat._entry and beat.reason != TAKEN:
                return beat

    def _visit(self, beat: Beat) -> bool:
        """Do what is due for ``beat``: presume it lost, hand its renewal to the worker, or wait. Lock held.

        Returns True if the lock was presumed lost just now (to be reported outside the lock).
        """
        now = self.clock()
        lost = now >= beat.deadline and self._mark(beat, PRESUMED, now)
        watch = beat._watch()
        if not beat._busy and now >= beat.due:
            beat._busy = True
            self._hand_over(beat)
        if not beat._busy:
            self._push(beat, min(beat.due, watch))
        elif watch < math.inf:  # its renewal is under way: the deadline stands (it re-pushes when done)
            self._push(beat, watch)
        return lost

    # -- the worker ------------------------------------------------------------------

    def _hand_over(self, beat: Beat) -> None:
        """Queue ``beat``'s renewal for its group's worker, starting it if need be. Lock held."""
        worker = self._workers.get(beat.group)
        if worker is None or not worker[1].is_alive():
            todo: queue.SimpleQueue[Beat | None] = queue.SimpleQueue()
            thread = threading.Thread(
                target=self._work, args=(todo,), name="uniqjob-heartbeat-renew", daemon=True
            )
            thread.start()
            worker = self._workers[beat.group] = (todo, thread)
        worker[0].put(beat)

    def _work(self, todo: queue.SimpleQueue[Beat | None]) -> None:
        for beat in iter(todo.get, None):
            self._renew(beat)

    def _renew(self, beat: Beat) -> None:
        """Renew ``beat``'s lease once; on confirmation move its deadline, else retry soon or give up."""
        sent = self.clock()  # before the request leaves: the store counts the lease from later
        failed = False
        try:
            mine = beat.renew()
        except Exception as exc:  # a store outage must not kill the thread that serves every job
            # One line per failure: during an outage every job's beat fails each second. Once
            # the loss has been reported, the tries that go on are no news.
            import logging  # loaded: here it logs

            level = logging.DEBUG if beat._is_lost() else logging.WARNING
            log.log(level, "heartbeat of %s failed (%s); retrying", beat.name, exc)
            mine, failed = True, True
        with self._cond:
            beat._busy = False
            if beat.cancelled or beat.reason == TAKEN:
                return  # the job released its lock while this renewal was on its way: nothing lost
            now = self.clock()
            if not mine:
                lost = self._mark(beat, TAKEN, now)
                beat.reason = TAKEN  # also if presumed lost before: now it is known, and renewals end
            else:
                # Confirmed (if at all) too late: it was presumed lost at the deadline, whoever
                # asked; the renewals go on all the same (see the module docstring).
                lost = now >= beat.deadline and self._mark(beat, PRESUMED, now)
                if not failed and beat.lease is not None:
                    beat.confirmed = sent
                    beat.deadline = deadline(sent, beat.lease)
                # Counted from the send, like the lease: a slow reply must not push the next one past it.
                beat.due = now + min(beat.interval / 2, RETRY) if failed else min(now, sent) + beat.interval
                self._push(beat, min(beat.due, beat._watch()))
        if lost:
            self._report(beat)

    # -- losses ----------------------------------------------------------------------

    def _presume(self, beat: Beat) -> None:
        """``beat``'s deadline has passed (a caller saw it): presume its lock lost, if not done yet."""
        with self._cond:
            lost = not beat.cancelled and self._mark(beat, PRESUMED, self.clock())
        if lost:
            self._report(beat)

    @staticmethod
    def _mark(beat: Beat, reason: str, now: float) -> bool:
        """Set ``beat`` lost for ``reason`` unless it already is; True if this call did. Lock held."""
        if beat._is_lost():
            return False
        beat.reason, beat.lost_at, beat.unconfirmed_for = reason, now, now - beat.confirmed
        beat.lost.set()
        return True

    def _report(self, beat: Beat) -> None:
        """Log the loss (once: only the call that marked it comes here); run ``on_lost`` on a new thread."""
        on_lost = beat.on_lost  # read now: the job may cancel its beat the moment it sees the loss
        if beat.reason == TAKEN:
            log.warning("lost the run lock of %s: %s", beat.name, beat.explain(), extra={LOST_RECORD: True})
        else:
            log.warning(
                "presumed the run lock of %s lost: %s; stop acting on it (renewals go on, token-checked)",
                beat.name,
                beat.explain().removeprefix("it is presumed lost: "),
                extra={LOST_RECORD: True},
            )
        if on_lost is not None:
            # Its own thread: neither the scheduler, which keeps every beat's time, nor
            # the job's thread (which may be asking `lost`) waits on what it does.
            threading.Thread(
                target=_call_on_lost, args=(beat.name, on_lost), name="uniqjob-on-lost", daemon=True
            ).start()


def _renewed() -> bool:
    """A cancelled beat's ``renew``: a renewal already handed to the worker finds it cancelled after."""
    return True


def _call_on_lost(name: str, on_lost: Callable[[], None]) -> None:
    try:
        on_lost()
    except Exception:
        log.exception("the on_lost callback of %s failed", name)


_MAKING = threading.Lock()  # guards the first making of a beat's ``lost``


def _remake_lock() -> None:
    global _MAKING
    _MAKING = threading.Lock()  # a fork taken while another thread held it must not leave it held


os.register_at_fork(after_in_child=_remake_lock)

#: The process-wide heartbeat used by jobs.
heartbeat = Heartbeat()
