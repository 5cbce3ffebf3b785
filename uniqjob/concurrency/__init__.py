"""Concurrency limits: a counting semaphore per key, with a FIFO of parked jobs that never ages out.

Set ``concurrency_limit`` on a job class (see the README's "Concurrency
limits"). The slots are kept by the stores (the contract,
:class:`SemaphoreStore`, and the records it returns are in
:mod:`uniqjob.stores.semaphores`; each store offers its own through
``Backend.semaphores()``); this package is the policy and the glue above them:

- :mod:`.semaphore`: :class:`Semaphore`, the policy above any store (liveness, heartbeat,
  pushing promoted calls to their queues, waiting inline);
- ``_settings``: a job class's ``concurrency_*`` settings, checked and resolved into its semaphore;
- ``_job``: the hooks ``UniqueJob`` calls;
- :mod:`.codec`: parked calls stored as typed JSON;
- :func:`sweep`: reclaim dead holders' slots and push what that promotes, for every key;
- :func:`release_slots`, :func:`discard_parked`: an operator's escape hatches for one key.

Each operation that calls the store is written once, for asyncio (``_semaphore_async``,
``_job_async``); its sync twin (``_semaphore_sync``, ``_job_sync``) is generated from it by
``scripts/unasync.py``: edit the asyncio file, then run the script. What needs no I/O is
imported by both (``_semaphore_base``, ``_job``).
"""

from __future__ import annotations

from ..stores.base import Backend
from ..stores.semaphores import (
    HANDOFF,
    Outcome,
    Park,
    ParkedInfo,
    Promotion,
    SemaphoreState,
    SemaphoreStore,
    SlotInfo,
)
from ._job import Parked
from ._stores import store_for
from .ops import Released, discard_parked, release_slots
from .semaphore import Semaphore, deliver, sweep_key

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
    "release_slots",
    "store_for",
    "sweep",
]


def sweep(backend: Backend | None = None) -> int:
    """Settle every concurrency key: free lapsed slots and dead holders', push what that promotes.

    Any call on a key settles it; this is for keys nobody touches, say all of
    whose jobs are parked behind a worker that died on another host. Run it
    from a worker's periodic task or from cron. Returns how many slots and
    places of holders proved dead (on this host) were reclaimed.
    """
    from .. import config

    store = store_for(backend if backend is not None else config.default_backend())
    return sum(sweep_key(store, key) for key in store.scan())
