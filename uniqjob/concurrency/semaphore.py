"""Semaphore: one concurrency key, above any store.

The policy lives here once for every store: proving holders dead on this host
(pid gone or reused) before their lease says so, keeping a running slot alive
with the shared heartbeat, waiting inline for a turn, and **delivering
promotions**. Every store primitive may hand the caller parked calls that were
just given a slot; the caller delivers each (``deliver``):

- a call parked for a queue is pushed to its class's ``unique_queue.push(cls,
  lock, args, kwargs)``, with the lock rebuilt from the stored key and the
  slot's token, and is then marked handed; its uniqueness lock then records the
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

import atexit
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ..heartbeat import heartbeat
from ..locks import Holder, local_holder
from ..stores.semaphores import HANDOFF, Promotion, SemaphoreStore
from ._courier import Courier
from ._semaphore_async import AsyncSemaphore, adeliver, asweep_key
from ._semaphore_base import Hold, wake
from ._semaphore_sync import SyncSemaphore, deliver, sweep_key

__all__ = ["Hold", "Semaphore", "adeliver", "asweep_key", "courier", "deliver", "deliver_later", "sweep_key"]

#: Pushes the promotions that the heartbeat's renewals find (see ``_courier.py``).
courier = Courier(deliver)
# At exit, pending deliveries get a sixth of the handoff time (the handoff covers the rest).
atexit.register(courier.drain, HANDOFF / 6)


def deliver_later(store: SemaphoreStore, key: str, promotions: Sequence[Promotion], caller: Holder) -> None:
    """Wake inline waiters at once; hand queue promotions to the courier thread, and return."""
    queued = []
    for promotion in promotions:
        if promotion.via == "inline":
            wake(store, key, promotion.token)
        else:
            queued.append(promotion)
    if queued:
        courier.send(store, key, queued, caller)


class Semaphore(SyncSemaphore, AsyncSemaphore):
    """The counting semaphore of one concurrency ``key``: up to ``limit`` slots.

    ``lease`` is how long a slot outlives its holder's silence; a running
    slot is renewed every ``interval`` seconds by the shared heartbeat.
    ``handoff`` bounds how long a promoter may take to push a promoted job.
    Each operation has a sync method (``acquire``, in ``_semaphore_sync.py``,
    generated) and an asyncio one (``aacquire``, in ``_semaphore_async.py``).
    """

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

    def hold(self, token: str) -> Hold:
        """Start keeping ``token``'s running slot alive with the heartbeat (the start of :meth:`running`)."""
        beat = heartbeat.start(lambda: self.renew(token), self.interval, f"concurrency {self.key}")
        return Hold(self, token, beat)

    @contextmanager
    def running(self, token: str) -> Iterator[Hold]:
        """Keep ``token``'s slot alive with the heartbeat for the body; release it (and promote) after.

        Unless the body hands the slot to the job's retry with :meth:`keep`.
        """
        hold: Hold | None = None
        try:
            hold = self.hold(token)
            yield hold
        finally:
            self.unhold(token, hold)
