"""Concurrency limits: a counting semaphore per key, with a FIFO of parked jobs that never ages out.

Set ``concurrency_limit`` on a job class (see the README's "Concurrency
limits"); this package keeps the slots. Its parts:

- :mod:`.base`: the store contract, :class:`SemaphoreStore`, and the records it returns;
- :mod:`.redis`, :mod:`.local`: the stores (Lua scripts; one JSON record per key under a file lock);
- :mod:`.semaphore`: :class:`Semaphore`, the policy above any store (liveness, heartbeat,
  delivering promotions, waiting inline);
- :mod:`.codec`: parked calls stored as typed JSON;
- :func:`sweep`: reclaim dead holders' slots and push what that promotes, for every key;
- :func:`release`, :func:`discard_parked`: an operator's escape hatches for one key.

The last three live in :mod:`uniqjob.ops` (``release`` there is ``release_slots``).
"""

from __future__ import annotations

from ..ops import Released, discard_parked, sweep
from ..ops import release_slots as release
from ._job import Parked
from ._stores import store_for
from .base import HANDOFF, Outcome, Park, ParkedInfo, Promotion, SemaphoreState, SemaphoreStore, SlotInfo
from .semaphore import Semaphore, deliver

__all__ = [
    "HANDOFF",
    "Outcome",
    "Park",
    "Parked",
    "ParkedInfo",
    "Promotion",
    "Released",
    "Semaphore",
    "SemaphoreState",
    "SemaphoreStore",
    "SlotInfo",
    "deliver",
    "discard_parked",
    "release",
    "store_for",
    "sweep",
]
