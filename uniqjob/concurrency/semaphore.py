"""Semaphore: one concurrency key, above any store.

The policy lives here once for every store: proving holders dead on this host
(pid gone or reused) before their lease says so, keeping a running slot alive
with the shared heartbeat, waiting inline for a turn, and **delivering
promotions**. Every store primitive may hand the caller parked calls that were
just given a slot; the caller delivers each through the same hook:

- a call parked for a queue is handed to the job layer's pusher (see
  :func:`on_promotion`; it goes to its class's ``unique_queue.push(cls, lock,
  args, kwargs)``, with the lock rebuilt from the stored key and the slot's
  token), and is then marked handed; its uniqueness lock then records the
  queue's job id, as an enqueue's does. If the promoter dies before that, the
  promotion is claimed again by the next process that settles the key (at
  once when the promoter is provably dead, else after ``handoff`` seconds) and
  pushed again: at least once. The copies share the token, and a token's slot
  runs once: a second copy finds it running (``busy``) or remembered (``done``).
  Promotions found by the heartbeat are pushed by the courier thread
  (``_courier.py``), never by the heartbeat itself.
- a call parked inline is run by the process waiting for it, which polls its
  place; a promotion in this process wakes it at once.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

from ..errors import BackendError, CorruptRecordError
from ..heartbeat import Beat, heartbeat
from ..locks import Holder, holder_is_dead, local_holder
from ..stores.semaphores import HANDOFF, Outcome, Park, Promotion, SemaphoreState, SemaphoreStore, SlotInfo
from ._courier import Courier

__all__ = ["Hold", "Pusher", "Semaphore", "courier", "deliver", "deliver_later", "on_promotion", "sweep_key"]

log = logging.getLogger(__name__)

_ATTEMPTS = 3  # reaping dead holders and trying again; a key that keeps changing hands is full
_POLL_MIN, _POLL_MAX = 0.01, 0.2  # seconds between an inline waiter's polls (backing off)
_SWEEP_EVERY = 1.0  # seconds between an inline waiter's checks of the holders' liveness

# Inline waiters of this process, woken when this process promotes them.
_waiters: dict[tuple[int, str, str], threading.Event] = {}
_waiters_mutex = threading.Lock()


def _wake(store: SemaphoreStore, key: str, token: str) -> None:
    with _waiters_mutex:
        event = _waiters.get((id(store), key, token))
    if event is not None:
        event.set()


def deliver(
    store: SemaphoreStore, key: str, promotions: Sequence[Promotion], caller: Holder | None = None
) -> int:
    """Hand each promotion to its queue (or wake its inline waiter); return how many were pushed.

    A failure is logged, never raised: the caller's own job is done, and the
    promotion is pushed again by whoever settles the key after the handoff time.
    """
    pushed = 0
    for promotion in promotions:
        if promotion.via == "inline":
            _wake(store, key, promotion.token)
            continue
        try:
            # In a context of its own: the promoted call is not the caller's call, and must
            # not see its context (Celery reads the task id and options of an apply_async from it).
            contextvars.Context().run(_push, store, key, promotion, caller or local_holder())
        except Exception:
            log.error(
                "could not hand parked job %s of %s to its queue; it is pushed again after %.0fs",
                promotion.token,
                key,
                HANDOFF,
                exc_info=True,
            )
            continue
        pushed += 1
    return pushed


#: Hands a call parked for a queue, whose turn came, to that queue: ``push(store, key,
#: promotion)`` pushes it and returns what to do once the store knows it was handed (record
#: the queue's job id in its lock). The job layer registers it (:func:`on_promotion`): this
#: module never imports a job class.
Pusher = Callable[[SemaphoreStore, str, Promotion], Callable[[], None]]
_pushers: list[Pusher] = []


def on_promotion(push: Pusher) -> None:
    """Make ``push`` the one that hands promoted calls to their queues (the job layer registers it)."""
    _pushers[:] = [push]


def _push(store: SemaphoreStore, key: str, promotion: Promotion, caller: Holder) -> None:
    if not _pushers:
        raise BackendError(f"nothing registered to push parked job {promotion.token} of {key}", store.name)
    if promotion.redo:
        log.warning("pushing parked job %s of %s again (its promoter stopped)", promotion.token, key)
    handed = _pushers[0](store, key, promotion)
    store.handed(key, promotion.token, caller)
    handed()


#: Pushes the promotions that the heartbeat's renewals find (see ``_courier.py``).
courier = Courier(deliver)
courier.register_exit(HANDOFF / 6)


def deliver_later(store: SemaphoreStore, key: str, promotions: Sequence[Promotion], caller: Holder) -> None:
    """Wake inline waiters at once; hand queue promotions to the courier thread, and return."""
    queued = []
    for promotion in promotions:
        if promotion.via == "inline":
            _wake(store, key, promotion.token)
        else:
            queued.append(promotion)
    if queued:
        courier.send(store, key, queued, caller)


_SWEEP_HEAD = 100  # parked places a sweep checks for dead inline waiters


def sweep_key(store: SemaphoreStore, key: str, *, handoff: float = HANDOFF) -> int:
    """Reap ``key``'s slots and leading inline places whose holder is provably dead; deliver what it promotes.

    Every store call settles the key (lapsed leases, a lost handoff); this adds
    the liveness check that needs no wait. Returns how many slots and places went.
    A key whose records are corrupt is logged (with how to clear it) and skipped.
    """
    me = local_holder()
    try:
        state = store.read(key, head=_SWEEP_HEAD)
    except CorruptRecordError as exc:
        # One damaged key must not stop the upkeep of every other: it stays blocked, and says so.
        log.error("%s", exc)
        return 0
    held = [(s.token, s.holder) for s in state.slots if s.holder is not None]
    waiting = [(p.token, p.holder) for p in state.head if p.holder is not None]
    dead = [(token, holder) for token, holder in held + waiting if holder_is_dead(holder)]
    outcome = store.reap(key, dead, caller=me, handoff=handoff)
    deliver(store, key, outcome.promotions, me)
    return outcome.count


class Hold:
    """A slot running in this process (see :meth:`Semaphore.running`), released when its body ends.

    A job that its queue will run again (a retry) keeps the slot instead: the
    retry has the same token, and holds the key's place while it waits.
    """

    def __init__(self, semaphore: Semaphore, token: str, beat: Beat | None) -> None:
        self.semaphore = semaphore
        self.token = token
        self.beat = beat  # None: a delivery that failed before its slot ran (nothing beats)
        #: True once the slot went to the job's retry: it is not released when the body ends.
        self.kept = False

    def keep(self, delay: float) -> bool:
        """Hand the slot to the job's retry, due in ``delay`` seconds: reserved again, kept after the body.

        Called before the retry is sent, so the retry can never find the slot
        still running here. False (and released as usual) if it is not ours.
        """
        if self.beat is not None:
            self.beat.cancel()
        self.kept = self.semaphore.requeue(self.token, delay)
        return self.kept

    def unkeep(self) -> None:
        """No retry is coming after all (it was never sent): release the slot when the body ends."""
        self.kept = False


class Semaphore:
    """The counting semaphore of one concurrency ``key``: up to ``limit`` slots.

    ``lease`` is how long a slot outlives its holder's silence; a running
    slot is renewed every ``interval`` seconds by the shared heartbeat.
    ``handoff`` bounds how long a promoter may take to push a promoted job.
    """

    def __init__(
        self,
        store: SemaphoreStore,
        key: str,
        *,
        limit: int,
        lease: float,
        interval: float,
        handoff: float = HANDOFF,
        job_class: str = "",
    ) -> None:
        self.store = store
        self.key = key
        self.limit = limit
        self.lease = lease
        self.interval = interval
        self.handoff = handoff
        self.job_class = job_class

    def __repr__(self) -> str:
        return f"Semaphore({self.key!r}, limit={self.limit}, store={self.store!r})"

    def _deliver(self, promotions: Sequence[Promotion]) -> None:
        if promotions:
            deliver(self.store, self.key, promotions)

    def _dead(self, slots: Sequence[SlotInfo]) -> list[tuple[str, Holder]]:
        """The slots whose holder is provably dead (this host only; elsewhere the lease decides)."""
        return [(s.token, s.holder) for s in slots if s.holder is not None and holder_is_dead(s.holder)]

    # -- taking a slot -----------------------------------------------------------------

    def acquire(
        self,
        token: str,
        *,
        running: bool,
        park: Park | None = None,
        args: str = "",
        delay: float = 0.0,
    ) -> Outcome:
        """Take a slot for ``token`` (``taken``), park the call (``parked``) or find the key ``full``.

        ``running``: the caller performs now and holds the slot; else the job
        waits in a queue, and the slot's lease covers ``delay`` too. Slots of
        holders proved dead are reclaimed first.
        """
        me = local_holder()
        outcome = Outcome("full")
        for _ in range(_ATTEMPTS):
            outcome = self.store.acquire(
                self.key,
                token,
                limit=self.limit,
                lease=self.lease + max(delay, 0.0),
                running=running,
                holder=me if running else None,
                park=park,
                job_class=self.job_class,
                args=args,
                caller=me,
                handoff=self.handoff,
            )
            self._deliver(outcome.promotions)
            if outcome.status == "taken":
                return outcome
            dead = self._dead(outcome.slots)
            if not dead:
                return outcome
            log.warning("reclaiming %d concurrency slot(s) of %s from dead holders", len(dead), self.key)
            self._deliver(self.store.reap(self.key, dead, caller=me, handoff=self.handoff).promotions)
            if outcome.status == "parked":
                return outcome  # the reap promoted the oldest calls, ours among them if its turn came
        return outcome

    def start(self, token: str) -> Outcome:
        """Mark ``token``'s slot running in this process (``run``); see :meth:`SemaphoreStore.start`.

        A slot running for a holder proved dead (a crashed worker whose job was
        delivered again) is taken over.
        """
        me = local_holder()
        takeover: Holder | None = None
        for _ in range(_ATTEMPTS):
            outcome = self.store.start(
                self.key,
                token,
                holder=me,
                lease=self.lease,
                takeover=takeover,
                caller=me,
                handoff=self.handoff,
            )
            self._deliver(outcome.promotions)
            if outcome.status != "busy" or outcome.holder is None or not holder_is_dead(outcome.holder):
                return outcome
            log.warning("taking over concurrency slot %s of %s from a dead holder", token, self.key)
            takeover = outcome.holder
        return outcome

    # -- holding it ------------------------------------------------------------------

    def renew(self, token: str) -> bool:
        """Extend ``token``'s slot (or inline place) by a lease; False if it is gone.

        The heartbeat calls this for every running slot in the process: what
        its settling promotes is pushed by the courier thread, not here.
        """
        me = local_holder()
        outcome = self.store.renew(self.key, token, self.lease, caller=me, handoff=self.handoff)
        if outcome.promotions:
            deliver_later(self.store, self.key, outcome.promotions, me)
        return outcome.status == "ok"

    def requeue(self, token: str, delay: float = 0.0) -> bool:
        """Keep ``token``'s running slot, reserved, for a retry due in ``delay`` seconds; False if not ours.

        Its lease covers the delay. A store failure is logged and False
        returned: the caller then releases the slot as usual.
        """
        me = local_holder()
        lease = self.lease + max(delay, 0.0)
        try:
            outcome = self.store.requeue(self.key, token, lease, holder=me, caller=me, handoff=self.handoff)
        except Exception:  # whatever the client throws: the job's own outcome must reach its queue
            log.error("could not keep concurrency slot of %s for a retry", self.key, exc_info=True)
            return False
        self._deliver(outcome.promotions)
        return outcome.status == "ok"

    def release(self, token: str) -> bool:
        """Free ``token``'s slot and deliver what it promoted; False if it held none. Never raises.

        A store failure of any kind is logged, not raised (the job already
        ran, and raising would invite a retry, a duplicate): the slot then
        lapses with its lease and the next settle promotes behind it.
        """
        try:
            outcome = self.store.release(self.key, token, caller=local_holder(), handoff=self.handoff)
        except Exception:
            log.error(
                "could not release concurrency slot of %s; it lapses with its lease", self.key, exc_info=True
            )
            return False
        self._deliver(outcome.promotions)
        return outcome.status == "released"

    def abandon(self, token: str) -> None:
        """Give up whatever ``token`` may hold on the key, a place in line or a slot, after a failed step.

        Token-checked and never raising: a step whose reply was lost may have
        taken either on the store. What cannot be undone now (the store is
        away) lapses with its lease, as every concurrency record does.
        """
        try:
            self.store.withdraw(self.key, token)
        except Exception:
            log.warning("could not withdraw call %s from the line of %s", token, self.key, exc_info=True)
        self.release(token)

    @contextmanager
    def running(self, token: str) -> Iterator[Hold]:
        """Keep ``token``'s slot alive with the heartbeat for the body; release it (and promote) after.

        Unless the body hands the slot to the job's retry with :meth:`Hold.keep`.
        """
        hold: Hold | None = None
        try:
            # inside the try: a heartbeat that cannot start must not keep the slot for a lease
            beat = heartbeat.start(lambda: self.renew(token), self.interval, f"concurrency {self.key}")
            hold = Hold(self, token, beat)
            yield hold
        finally:
            if hold is not None and hold.beat is not None:
                hold.beat.cancel()
            if hold is None or not hold.kept:
                self.release(token)

    # -- waiting inline ----------------------------------------------------------------

    def wait(
        self, token: str, timeout: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> Literal["run", "discarded", "lapsed", "timeout"]:
        """Wait until the inline call ``token`` (already parked) is promoted, then mark it running.

        Polling the store renews the call's place. Returns ``run`` (it holds a
        running slot now), ``discarded`` (an operator dropped it), ``lapsed``
        (this process went a whole lease without polling, so its place was
        dropped as a dead waiter's) or ``timeout`` (it was withdrawn from the
        list after ``timeout`` seconds).
        """
        event = threading.Event()
        slot = (id(self.store), self.key, token)
        with _waiters_mutex:
            _waiters[slot] = event
        deadline = None if timeout is None else clock() + timeout
        pause, swept = _POLL_MIN, clock()
        polled = swept  # the place was taken (or last renewed) by then
        try:
            while True:
                event.clear()
                now = clock()
                outcome = self.start(token)
                if outcome.status == "run":
                    return "run"
                if outcome.status != "parked":
                    # Gone from the line: dropped by an operator, or as a dead waiter's if this
                    # process was silent for a lease (suspended, swapped out) and the place lapsed.
                    return "lapsed" if now - polled >= self.lease else "discarded"
                polled = now
                if deadline is not None and now >= deadline:
                    if self.store.withdraw(self.key, token).status == "withdrawn":
                        return "timeout"
                    continue  # promoted at the last moment: run it
                if now - swept >= _SWEEP_EVERY:
                    self.sweep()
                    swept = now
                wait = pause if deadline is None else min(pause, max(deadline - now, 0.0))
                pause = _POLL_MIN if event.wait(wait) else min(pause * 2, _POLL_MAX)
        finally:
            with _waiters_mutex:
                _waiters.pop(slot, None)

    # -- upkeep ----------------------------------------------------------------------

    def sweep(self) -> int:
        """Reclaim slots and places of holders proved dead, and deliver what that promotes.

        Returns how many slots and places went. Lapsed leases are freed by any
        store call; this adds the same-host liveness check, which needs no wait.
        """
        return sweep_key(self.store, self.key, handoff=self.handoff)

    def read(self, head: int = 5) -> SemaphoreState:
        """Return a snapshot of the key."""
        return self.store.read(self.key, head=head)
