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

Each operation is written once, as steps (:mod:`uniqjob._steps`): a store
primitive is a step with two faces (called on the sync path, awaited through
the store's async face on the asyncio one, :func:`._stores.acall`), a wait
for a turn a step too. ``acquire()``, ``release()``, ``wait()`` and the rest
drive them synchronously; the job layer's asyncio API yields from the same
``*_steps`` generators and awaits them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import partial
from typing import Any, Literal, TypeVar, cast

from .._steps import Step, Steps, drive, twin_of
from ..errors import BackendError, CorruptRecordError
from ..heartbeat import Beat, heartbeat
from ..locks import Holder, holder_is_dead, local_holder
from ..stores.aio import completed
from ..stores.base import Backend
from ..stores.semaphores import HANDOFF, Outcome, Park, Promotion, SemaphoreState, SemaphoreStore, SlotInfo
from ._courier import Courier
from ._stores import acall

__all__ = [
    "Hold",
    "Pusher",
    "Semaphore",
    "courier",
    "deliver",
    "deliver_later",
    "deliver_steps",
    "on_promotion",
    "run_steps",
    "store_step",
    "sweep_key",
    "sweep_key_steps",
]

T = TypeVar("T")

log = logging.getLogger(__name__)

_ATTEMPTS = 3  # reaping dead holders and trying again; a key that keeps changing hands is full
_POLL_MIN, _POLL_MAX = 0.01, 0.2  # seconds between an inline waiter's polls (backing off)
_SWEEP_EVERY = 1.0  # seconds between an inline waiter's checks of the holders' liveness

# Semaphore steps never touch a lock store: driven with none.
_NO_LOCKS = cast(Backend, None)


def run_steps(steps: Steps[T]) -> T:
    """Drive semaphore ``steps`` synchronously (they yield no lock-store primitive)."""
    return drive(_NO_LOCKS, steps)


def store_step(store: SemaphoreStore, name: str, *args: Any, **kwargs: Any) -> Step:
    """The step of primitive ``name`` of ``store``: called on the sync path, awaited on the async one."""
    return twin_of(getattr(store, name), partial(acall, store, name), *args, **kwargs)


def made_step(store: SemaphoreStore, name: str, *args: Any, **kwargs: Any) -> Step:
    """:func:`store_step`, awaited to its end on the async path even if the task is cancelled meanwhile."""
    return twin_of(getattr(store, name), partial(_made, store, name), *args, **kwargs)


async def _made(store: SemaphoreStore, name: str, *args: Any, **kwargs: Any) -> Any:
    return await completed(acall(store, name, *args, **kwargs))


class _Waker:
    """What an inline waiter of this process waits on: set by a promotion, from any thread.

    A sync waiter waits on its event; an async one on an :class:`asyncio.Event` of
    its loop, set through the loop (``call_soon_threadsafe``) by a promotion made anywhere.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._aevent: asyncio.Event | None = None

    def set(self) -> None:
        self._event.set()  # first: an async waiter checks it after making its event
        loop, aevent = self._loop, self._aevent
        if loop is not None and aevent is not None:
            with suppress(RuntimeError):  # its loop is closed: no one is waiting there any more
                loop.call_soon_threadsafe(aevent.set)

    def clear(self) -> None:
        self._event.clear()
        if self._aevent is not None:
            self._aevent.clear()

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` (blocking); True if woken."""
        return self._event.wait(seconds)

    async def await_(self, seconds: float) -> bool:
        """Await up to ``seconds`` (the event loop runs on); True if woken."""
        if self._aevent is None:
            self._aevent = asyncio.Event()
            self._loop = asyncio.get_running_loop()
        if self._event.is_set():
            return True
        try:
            await asyncio.wait_for(self._aevent.wait(), seconds)
        except TimeoutError:
            return self._event.is_set()
        return True


# Inline waiters of this process, woken when this process promotes them.
_waiters: dict[tuple[int, str, str], _Waker] = {}
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
    return run_steps(deliver_steps(store, key, promotions, caller))


def deliver_steps(
    store: SemaphoreStore, key: str, promotions: Sequence[Promotion], caller: Holder | None = None
) -> Steps[int]:
    """The steps of :func:`deliver`."""
    pushed = 0
    for promotion in promotions:
        if promotion.via == "inline":
            _wake(store, key, promotion.token)
            continue
        try:
            yield from _push(store, key, promotion, caller or local_holder())
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
#: the queue's job id in its lock): a function, or steps that push (in a context of their
#: own: the promoted call is not the caller's) and return the step to take after the
#: handoff. The job layer registers it (:func:`on_promotion`): this module never imports a
#: job class.
Pusher = Callable[[SemaphoreStore, str, Promotion], "Callable[[], None] | Steps[Step]"]
_pushers: list[Pusher] = []


def on_promotion(push: Pusher) -> None:
    """Make ``push`` the one that hands promoted calls to their queues (the job layer registers it)."""
    _pushers[:] = [push]


def _push(store: SemaphoreStore, key: str, promotion: Promotion, caller: Holder) -> Steps[None]:
    if not _pushers:
        raise BackendError(f"nothing registered to push parked job {promotion.token} of {key}", store.name)
    if promotion.redo:
        log.warning("pushing parked job %s of %s again (its promoter stopped)", promotion.token, key)
    made = _pushers[0](store, key, promotion)
    after: Step = (yield from made) if isinstance(made, Generator) else (made, (), {})
    yield store_step(store, "handed", key, promotion.token, caller)
    yield after


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
    return run_steps(sweep_key_steps(store, key, handoff=handoff))


def sweep_key_steps(store: SemaphoreStore, key: str, *, handoff: float = HANDOFF) -> Steps[int]:
    """The steps of :func:`sweep_key`."""
    me = local_holder()
    try:
        state: SemaphoreState = yield store_step(store, "read", key, head=_SWEEP_HEAD)
    except CorruptRecordError as exc:
        # One damaged key must not stop the upkeep of every other: it stays blocked, and says so.
        log.error("%s", exc)
        return 0
    held = [(s.token, s.holder) for s in state.slots if s.holder is not None]
    waiting = [(p.token, p.holder) for p in state.head if p.holder is not None]
    dead = [(token, holder) for token, holder in held + waiting if holder_is_dead(holder)]
    outcome: Outcome = yield store_step(store, "reap", key, dead, caller=me, handoff=handoff)
    yield from deliver_steps(store, key, outcome.promotions, me)
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
        return run_steps(self.keep_steps(delay))

    def keep_steps(self, delay: float) -> Steps[bool]:
        """The steps of :meth:`keep`."""
        if self.beat is not None:
            self.beat.cancel()
        self.kept = yield from self.semaphore.requeue_steps(self.token, delay)
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

    def _op(self, name: str, *args: Any, **kwargs: Any) -> Step:
        return store_step(self.store, name, self.key, *args, **kwargs)

    def _deliver(self, promotions: Sequence[Promotion]) -> Steps[None]:
        if promotions:
            yield from deliver_steps(self.store, self.key, promotions)

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
        return run_steps(self.acquire_steps(token, running=running, park=park, args=args, delay=delay))

    def acquire_steps(
        self,
        token: str,
        *,
        running: bool,
        park: Park | None = None,
        args: str = "",
        delay: float = 0.0,
    ) -> Steps[Outcome]:
        """The steps of :meth:`acquire`."""
        me = local_holder()
        outcome: Outcome = Outcome("full")
        for _ in range(_ATTEMPTS):
            outcome = yield self._op(
                "acquire",
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
            yield from self._deliver(outcome.promotions)
            if outcome.status == "taken":
                return outcome
            dead = self._dead(outcome.slots)
            if not dead:
                return outcome
            log.warning("reclaiming %d concurrency slot(s) of %s from dead holders", len(dead), self.key)
            reaped: Outcome = yield self._op("reap", dead, caller=me, handoff=self.handoff)
            yield from self._deliver(reaped.promotions)
            if outcome.status == "parked":
                return outcome  # the reap promoted the oldest calls, ours among them if its turn came
        return outcome

    def start(self, token: str) -> Outcome:
        """Mark ``token``'s slot running in this process (``run``); see :meth:`SemaphoreStore.start`.

        A slot running for a holder proved dead (a crashed worker whose job was
        delivered again) is taken over.
        """
        return run_steps(self.start_steps(token))

    def start_steps(self, token: str) -> Steps[Outcome]:
        """The steps of :meth:`start`."""
        me = local_holder()
        takeover: Holder | None = None
        outcome: Outcome = Outcome("missing")
        for _ in range(_ATTEMPTS):
            outcome = yield self._op(
                "start",
                token,
                holder=me,
                lease=self.lease,
                takeover=takeover,
                caller=me,
                handoff=self.handoff,
            )
            yield from self._deliver(outcome.promotions)
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
        return run_steps(self.requeue_steps(token, delay))

    def requeue_steps(self, token: str, delay: float = 0.0) -> Steps[bool]:
        """The steps of :meth:`requeue`."""
        me = local_holder()
        lease = self.lease + max(delay, 0.0)
        try:
            outcome: Outcome = yield self._op(
                "requeue", token, lease, holder=me, caller=me, handoff=self.handoff
            )
        except Exception:  # whatever the client throws: the job's own outcome must reach its queue
            log.error("could not keep concurrency slot of %s for a retry", self.key, exc_info=True)
            return False
        yield from self._deliver(outcome.promotions)
        return outcome.status == "ok"

    def release(self, token: str) -> bool:
        """Free ``token``'s slot and deliver what it promoted; False if it held none. Never raises.

        A store failure of any kind is logged, not raised (the job already
        ran, and raising would invite a retry, a duplicate): the slot then
        lapses with its lease and the next settle promotes behind it.
        """
        return run_steps(self.release_steps(token))

    def release_steps(self, token: str) -> Steps[bool]:
        """The steps of :meth:`release`."""
        args, kwargs = (self.key, token), {"caller": local_holder(), "handoff": self.handoff}
        try:
            outcome: Outcome = yield store_step(self.store, "release", *args, **kwargs)
        except Exception:
            self._unreleased()
            return False
        except GeneratorExit:
            raise
        except BaseException:
            # Cancelled (asyncio) or interrupted on the way: the release may not have been sent,
            # and the slot would be held for a whole lease. It is made to its end, however often
            # the task is cancelled meanwhile (token-checked: made twice, it frees nothing
            # more), what it promotes delivered, and the cancellation goes on.
            try:
                outcome = yield made_step(self.store, "release", *args, **kwargs)
            except Exception:
                self._unreleased()
            else:
                yield from self._deliver(outcome.promotions)
            raise
        yield from self._deliver(outcome.promotions)
        return outcome.status == "released"

    def _unreleased(self) -> None:
        log.error(
            "could not release concurrency slot of %s; it lapses with its lease", self.key, exc_info=True
        )

    def abandon(self, token: str) -> None:
        """Give up whatever ``token`` may hold on the key, a place in line or a slot, after a failed step.

        Token-checked and never raising: a step whose reply was lost may have
        taken either on the store. What cannot be undone now (the store is
        away) lapses with its lease, as every concurrency record does.
        """
        run_steps(self.abandon_steps(token))

    def abandon_steps(self, token: str) -> Steps[None]:
        """The steps of :meth:`abandon`."""
        try:
            yield self._op("withdraw", token)
        except Exception:
            log.warning("could not withdraw call %s from the line of %s", token, self.key, exc_info=True)
        yield from self.release_steps(token)

    @contextmanager
    def running(self, token: str) -> Iterator[Hold]:
        """Keep ``token``'s slot alive with the heartbeat for the body; release it (and promote) after.

        Unless the body hands the slot to the job's retry with :meth:`Hold.keep`.
        """
        hold: Hold | None = None
        try:
            hold = self.hold(token)
            yield hold
        finally:
            run_steps(self.unhold_steps(token, hold))

    def hold(self, token: str) -> Hold:
        """Start keeping ``token``'s running slot alive with the heartbeat (the start of :meth:`running`)."""
        beat = heartbeat.start(lambda: self.renew(token), self.interval, f"concurrency {self.key}")
        return Hold(self, token, beat)

    def unhold_steps(self, token: str, hold: Hold | None) -> Steps[None]:
        """The end of :meth:`running`: stop the heartbeat; release the slot unless it was kept.

        ``hold`` None: the heartbeat never started (the slot is released: it must not stay a lease).
        """
        if hold is not None and hold.beat is not None:
            hold.beat.cancel()
        if hold is None or not hold.kept:
            yield from self.release_steps(token)

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
        return run_steps(self.wait_steps(token, timeout, clock))

    def wait_steps(
        self, token: str, timeout: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> Steps[Literal["run", "discarded", "lapsed", "timeout"]]:
        """The steps of :meth:`wait`: on the async path, an awaited wait (the event loop runs on)."""
        event = _Waker()
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
                outcome = yield from self.start_steps(token)
                if outcome.status == "run":
                    return "run"
                if outcome.status != "parked":
                    # Gone from the line: dropped by an operator, or as a dead waiter's if this
                    # process was silent for a lease (suspended, swapped out) and the place lapsed.
                    return "lapsed" if now - polled >= self.lease else "discarded"
                polled = now
                if deadline is not None and now >= deadline:
                    withdrawn: Outcome = yield self._op("withdraw", token)
                    if withdrawn.status == "withdrawn":
                        return "timeout"
                    continue  # promoted at the last moment: run it
                if now - swept >= _SWEEP_EVERY:
                    yield from self.sweep_steps()
                    swept = now
                wait = pause if deadline is None else min(pause, max(deadline - now, 0.0))
                woken = yield twin_of(event.wait, event.await_, wait)
                pause = _POLL_MIN if woken else min(pause * 2, _POLL_MAX)
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

    def sweep_steps(self) -> Steps[int]:
        """The steps of :meth:`sweep`."""
        return (yield from sweep_key_steps(self.store, self.key, handoff=self.handoff))

    def read(self, head: int = 5) -> SemaphoreState:
        """Return a snapshot of the key."""
        return self.store.read(self.key, head=head)
