"""A semaphore's operations that call its store, written once, for asyncio (see the package's docstring)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Literal

from ..errors import CorruptRecordError
from ..locks import Holder, holder_is_dead, local_holder
from ..stores.semaphores import HANDOFF, Outcome, Park, Promotion, SemaphoreState
from . import _semaphore_base as base
from ._semaphore_base import (
    ATTEMPTS,
    POLL_MAX,
    POLL_MIN,
    SWEEP_EVERY,
    SWEEP_HEAD,
    Hold,
    SemaphoreBase,
    dead,
    log,
    promoted,
    waiting,
    wake,
)
from ._stores import AsyncSemaphores


async def adeliver(
    astore: AsyncSemaphores, key: str, promotions: Sequence[Promotion], caller: Holder | None = None
) -> int:
    """Hand each promotion to its queue (or wake its inline waiter); return how many were pushed.

    A failure is logged, never raised: the caller's own job is done, and the
    promotion is pushed again by whoever settles the key after the handoff time.
    """
    pushed = 0
    for promotion in promotions:
        if promotion.via == "inline":
            wake(astore, key, promotion.token)
            continue
        try:
            await _apush(astore, key, promotion, caller or local_holder())
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


async def _apush(astore: AsyncSemaphores, key: str, promotion: Promotion, caller: Holder) -> None:
    """Push one promotion to its class's queue, mark it handed, then record the queue's job id in its lock.

    From that record on, the queue may prove the job gone. Its failure is only
    logged: the job is pushed and handed, just its id is missing from its lock.
    """
    if promotion.redo:
        log.warning("pushing parked job %s of %s again (its promoter stopped)", promotion.token, key)
    lock, push = promoted(astore, promotion)
    await base.apush_call(push)
    await astore.handed(key, promotion.token, caller)
    try:
        await lock.aattach()
    except Exception:
        log.warning("could not record job id %s in the lock of %s", lock.meta.job_id, lock.key, exc_info=True)


async def asweep_key(astore: AsyncSemaphores, key: str, *, handoff: float = HANDOFF) -> int:
    """Reap ``key``'s slots and leading inline places whose holder is provably dead; deliver what it promotes.

    Every store call settles the key (lapsed leases, a lost handoff); this adds
    the liveness check that needs no wait. Returns how many slots and places went.
    A key whose records are corrupt is logged (with how to clear it) and skipped.
    """
    me = local_holder()
    try:
        state = await astore.read(key, head=SWEEP_HEAD)
    except CorruptRecordError as exc:
        # One damaged key must not stop the upkeep of every other: it stays blocked, and says so.
        log.error("%s", exc)
        return 0
    outcome = await astore.reap(key, dead([*state.slots, *state.head]), caller=me, handoff=handoff)
    await adeliver(astore, key, outcome.promotions, me)
    return outcome.count


class AsyncSemaphore(SemaphoreBase):
    """The operations of :class:`~uniqjob.concurrency.semaphore.Semaphore` that call its store."""

    # -- taking a slot -----------------------------------------------------------------

    async def aacquire(
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
        for _ in range(ATTEMPTS):
            outcome = await self.astore.acquire(
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
            await adeliver(self.astore, self.key, outcome.promotions, me)
            if outcome.status == "taken":
                return outcome
            gone = dead(outcome.slots)
            if not gone:
                return outcome
            log.warning("reclaiming %d concurrency slot(s) of %s from dead holders", len(gone), self.key)
            reaped = await self.astore.reap(self.key, gone, caller=me, handoff=self.handoff)
            await adeliver(self.astore, self.key, reaped.promotions, me)
            if outcome.status == "parked":
                return outcome  # the reap promoted the oldest calls, ours among them if its turn came
        return outcome

    async def astart(self, token: str) -> Outcome:
        """Mark ``token``'s slot running in this process (``run``); see :meth:`SemaphoreStore.start`.

        A slot running for a holder proved dead (a crashed worker whose job was
        delivered again) is taken over.
        """
        me = local_holder()
        takeover: Holder | None = None
        outcome = Outcome("missing")
        for _ in range(ATTEMPTS):
            outcome = await self.astore.start(
                self.key,
                token,
                holder=me,
                lease=self.lease,
                takeover=takeover,
                caller=me,
                handoff=self.handoff,
            )
            await adeliver(self.astore, self.key, outcome.promotions, me)
            if outcome.status != "busy" or outcome.holder is None or not holder_is_dead(outcome.holder):
                return outcome
            log.warning("taking over concurrency slot %s of %s from a dead holder", token, self.key)
            takeover = outcome.holder
        return outcome

    # -- holding it ------------------------------------------------------------------

    async def arequeue(self, token: str, delay: float = 0.0) -> bool:
        """Keep ``token``'s running slot, reserved, for a retry due in ``delay`` seconds; False if not ours.

        Its lease covers the delay. A store failure is logged and False
        returned: the caller then releases the slot as usual.
        """
        me = local_holder()
        lease = self.lease + max(delay, 0.0)
        try:
            outcome = await self.astore.requeue(
                self.key, token, lease, holder=me, caller=me, handoff=self.handoff
            )
        except Exception:  # whatever the client throws: the job's own outcome must reach its queue
            log.error("could not keep concurrency slot of %s for a retry", self.key, exc_info=True)
            return False
        await adeliver(self.astore, self.key, outcome.promotions, me)
        return outcome.status == "ok"

    async def akeep(self, hold: Hold, delay: float) -> bool:
        """Hand ``hold``'s slot to the job's retry (due in ``delay`` s): reserved again, kept after the body.

        Called before the retry is sent, so the retry can never find the slot
        still running here. False (and released as usual) if it is not ours.
        """
        if hold.beat is not None:
            hold.beat.cancel()
        hold.kept = await self.arequeue(hold.token, delay)
        return hold.kept

    async def arelease(self, token: str) -> bool:
        """Free ``token``'s slot and deliver what it promoted; False if it held none. Never raises.

        A store failure of any kind is logged, not raised (the job already
        ran, and raising would invite a retry, a duplicate): the slot then
        lapses with its lease and the next settle promotes behind it.
        """
        me = local_holder()
        try:
            outcome = await self.astore.release(self.key, token, caller=me, handoff=self.handoff)
        except Exception:
            self._unreleased()
            return False
        except BaseException:
            # Cancelled (asyncio) or interrupted on the way: the release may not have been sent,
            # and the slot would be held for a whole lease. It is made to its end, however often
            # the task is cancelled meanwhile (token-checked: made twice, it frees nothing
            # more), what it promotes delivered, and the cancellation goes on.
            try:
                outcome = await base.aensured(
                    self.astore.release(self.key, token, caller=me, handoff=self.handoff)
                )
            except Exception:
                self._unreleased()
            else:
                await adeliver(self.astore, self.key, outcome.promotions, me)
            raise
        await adeliver(self.astore, self.key, outcome.promotions, me)
        return outcome.status == "released"

    async def aabandon(self, token: str) -> None:
        """Give up whatever ``token`` may hold on the key, a place in line or a slot, after a failed step.

        Token-checked and never raising: a step whose reply was lost may have
        taken either on the store. What cannot be undone now (the store is
        away) lapses with its lease, as every concurrency record does.
        """
        try:
            await self.astore.withdraw(self.key, token)
        except Exception:
            log.warning("could not withdraw call %s from the line of %s", token, self.key, exc_info=True)
        await self.arelease(token)

    async def aunhold(self, token: str, hold: Hold | None) -> None:
        """The end of :meth:`running`: stop the heartbeat; release the slot unless it was kept.

        ``hold`` None: the heartbeat never started (the slot is released: it must not stay a lease).
        """
        if hold is not None and hold.beat is not None:
            hold.beat.cancel()
        if hold is None or not hold.kept:
            await self.arelease(token)

    # -- waiting inline ----------------------------------------------------------------

    async def await_(
        self, token: str, timeout: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> Literal["run", "discarded", "lapsed", "timeout"]:
        """Wait until the inline call ``token`` (already parked) is promoted, then mark it running.

        Polling the store renews the call's place. Returns ``run`` (it holds a
        running slot now), ``discarded`` (an operator dropped it), ``lapsed``
        (this process went a whole lease without polling, so its place was
        dropped as a dead waiter's) or ``timeout`` (it was withdrawn from the
        list after ``timeout`` seconds).
        """
        with waiting(self.store, self.key, token) as event:
            deadline = None if timeout is None else clock() + timeout
            pause, swept = POLL_MIN, clock()
            polled = swept  # the place was taken (or last renewed) by then
            while True:
                event.clear()
                now = clock()
                outcome = await self.astart(token)
                if outcome.status == "run":
                    return "run"
                if outcome.status != "parked":
                    # Gone from the line: dropped by an operator, or as a dead waiter's if this
                    # process was silent for a lease (suspended, swapped out) and the place lapsed.
                    return "lapsed" if now - polled >= self.lease else "discarded"
                polled = now
                if deadline is not None and now >= deadline:
                    withdrawn = await self.astore.withdraw(self.key, token)
                    if withdrawn.status == "withdrawn":
                        return "timeout"
                    continue  # promoted at the last moment: run it
                if now - swept >= SWEEP_EVERY:
                    await self.asweep()
                    swept = now
                wait = pause if deadline is None else min(pause, max(deadline - now, 0.0))
                woken = await event.await_(wait)
                pause = POLL_MIN if woken else min(pause * 2, POLL_MAX)

    # -- upkeep ----------------------------------------------------------------------

    async def asweep(self) -> int:
        """Reap this key's slots and places of holders proved dead (see :func:`asweep_key`); how many went."""
        return await asweep_key(self.astore, self.key, handoff=self.handoff)

    async def aread(self, head: int = 5) -> SemaphoreState:
        """Return a snapshot of the key."""
        return await self.astore.read(self.key, head=head)
