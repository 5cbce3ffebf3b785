"""Operators' escape hatches for one concurrency key: release its slots, discard its parked jobs.

Both act on one key at a time; there is deliberately no "discard everything".
:mod:`uniqjob.ops` offers them, the same objects, beside the
other operations, and ``uniqjob release KEY`` and ``uniqjob discard-parked KEY`` call them there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial

from .. import config
from .._undo import undos
from ..locks import holder_is_dead, local_holder
from ..stores._log import get_logger
from ..stores.base import Backend
from ..stores.semaphores import SlotInfo
from ._stores import store_for
from .semaphore import deliver

__all__ = ["Released", "discard_parked", "release_slots", "stale"]

log = get_logger(__name__)


def stale(slot: SlotInfo) -> bool:
    """True when a slot's lease lapsed or its holder is provably dead: freeing it lets no job run twice."""
    return slot.lease_left <= 0 or (slot.holder is not None and holder_is_dead(slot.holder))


@dataclass(frozen=True, slots=True)
class Released:
    """What :func:`release_slots` did to a key."""

    key: str
    limit: int
    released: int  # slots freed
    forced: int  # of those, slots whose lease was fresh: their jobs may still be running
    kept: int  # fresh slots left alone (no ``force``)
    promoted: int  # parked jobs given the freed slots (never more than the limit allows)
    unpushed: int  # of those, queue jobs this process could not push (a worker pushes them later)
    fresh: tuple[SlotInfo, ...] = ()  # the slots whose lease was fresh when read: kept, or forced out


def release_slots(key: str, backend: Backend | None = None, *, force: bool = False) -> Released | None:
    """Free ``key``'s stale slots (with ``force``, its fresh ones too) and promote into them.

    Returns None if the key holds no slot and has nothing parked. Promotion
    goes through the same guarded step as a finishing job's: the oldest parked
    jobs take the freed slots, never more than the limit. A fresh slot's job
    may still be running: forcing it out lets one more job run at once until it ends.
    """
    store = store_for(backend if backend is not None else config.default_backend())
    state = store.read(key, head=0)
    if state.empty:
        return None
    fresh = tuple(s for s in state.slots if not stale(s))
    drop = state.slots if force else [s for s in state.slots if s not in fresh]
    me = local_holder()
    outcome = store.drop(key, [s.token for s in drop], caller=me)
    queued = [p for p in outcome.promotions if p.via == "queue"]
    pushed = deliver(store, key, outcome.promotions, me)
    return Released(
        key=key,
        limit=state.limit,
        released=outcome.count,
        forced=len(fresh) if force else 0,
        kept=0 if force else len(fresh),
        promoted=len(outcome.promotions),
        unpushed=len(queued) - pushed,
        fresh=fresh,
    )


def discard_parked(key: str, backend: Backend | None = None) -> int:
    """Drop every job parked on ``key`` and free their uniqueness locks; return how many went.

    Those jobs will not run. A process waiting inline for its turn sees its
    call dropped and returns None.
    """
    backend = backend if backend is not None else config.default_backend()
    dropped = store_for(backend).discard_parked(key)
    for token, payload in dropped:
        if not payload:
            continue  # an inline waiter frees its own lock when it sees its place gone
        try:
            lock_key = json.loads(payload).get("lock", "")
        except (ValueError, AttributeError):
            lock_key = ""
        if lock_key:
            # the parked job held its uniqueness lock, queued and without a job id, until it ran
            _dequeue(backend, lock_key, token)
    log.info("discarded %d parked job(s) of %s", len(dropped), key)
    return len(dropped)


def _dequeue(backend: Backend, lock_key: str, token: str) -> None:
    """Drop a discarded job's queued uniqueness lock; if the store fails, keep trying until it answers.

    The job is already off the line: a lock left behind would refuse its key
    for good (it names no job a queue could prove gone), and one failure must
    not leave the other discarded jobs' locks behind either.
    """
    try:
        backend.dequeue(lock_key, token)
    except Exception as exc:
        log.warning("could not drop the lock of discarded job %s yet (%s); retrying", lock_key, exc)
        undos.add(partial(backend.dequeue, lock_key, token), f"queue lock of {lock_key}", (token,))
