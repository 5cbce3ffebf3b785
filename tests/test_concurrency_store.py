"""The semaphore store contract, kept by every store in ``tests/conftest.py``'s ``STORES`` alike.

File, memory and dict stores run on a fake clock; Redis runs on the server's clock,
so the tests that age a lease use leases of a few tens of milliseconds there.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import STORES, FakeClock, make_store
from uniqjob.concurrency import Outcome, Park, SemaphoreState, SemaphoreStore, store_for
from uniqjob.errors import CorruptRecordError
from uniqjob.locks import Holder
from uniqjob.stores._stripes import _StripeLock
from uniqjob.stores.base import Backend
from uniqjob.stores.file import FileBackend, FileSemaphores
from uniqjob.stores.memory import MemoryBackend
from uniqjob.stores.redis import RedisBackend
from uniqjob.stores.redis._semaphores import RedisSemaphores

ME = Holder("here", "node-1", 100, 1)
OTHER = Holder("there", "node-2", 200, 2)
WAITER = Holder("here", "node-1", 300, 3)
K = "jobs.Export:acct-1"
LONG = 60.0  # a lease that never lapses during a test
SHORT = 0.05  # a lease a test lets lapse


@dataclass
class Store:
    store: SemaphoreStore
    age: Callable[[float], None]  # let time pass on the store's clock
    backend: Backend


@pytest.fixture(params=list(STORES))
def s(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Store:
    backend = make_store(request, tmp_path, clock)
    if STORES[request.param].fake_clock:
        return Store(store_for(backend), clock.advance, backend)
    return Store(store_for(backend), lambda seconds: time.sleep(seconds * 1.5), backend)


def take(
    s: Store,
    token: str,
    *,
    limit: int = 2,
    lease: float = LONG,
    running: bool = False,
    park: Park | None = None,
    key: str = K,
) -> str:
    out = s.store.acquire(
        key, token, limit=limit, lease=lease, running=running, holder=ME if running else None, park=park,
        job_class="jobs.Export", args=f"({token!r})", caller=ME,
    )  # fmt: skip
    return out.status


def acquire(store: SemaphoreStore, token: str, *, limit: int = 1, park: Park | None = None) -> Outcome:
    return store.acquire(
        K,
        token,
        limit=limit,
        lease=LONG,
        running=False,
        holder=None,
        park=park,
        job_class="",
        args="",
        caller=ME,
    )


def queued(payload: str = "{}") -> Park:
    return Park("queue", payload)


def tokens(s: Store, key: str = K) -> list[str]:
    return sorted(slot.token for slot in s.store.read(key).slots)


def test_slots_up_to_the_limit_then_full(s: Store) -> None:
    assert take(s, "a") == "taken"
    assert take(s, "b") == "taken"
    out = acquire(s.store, "c", limit=2)
    assert out.status == "full"
    assert sorted(slot.token for slot in out.slots) == ["a", "b"]  # who is in the way, for liveness checks
    assert tokens(s) == ["a", "b"]


def test_the_limit_applies_per_key(s: Store) -> None:
    for token in "abc":
        assert take(s, token, limit=3) == "taken"
        assert take(s, token + "2", limit=3, key="jobs.Export:acct-2") == "taken"
    assert take(s, "d", limit=3) == "full"


def test_acquire_is_idempotent_per_token(s: Store) -> None:
    assert take(s, "a", limit=1) == "taken"
    assert take(s, "a", limit=1) == "taken"
    assert tokens(s) == ["a"]
    assert take(s, "b", limit=1, park=queued()) == "parked"
    out = s.store.acquire(
        K,
        "b",
        limit=1,
        lease=LONG,
        running=False,
        holder=None,
        park=queued(),
        job_class="",
        args="",
        caller=ME,
    )
    assert (out.status, out.position) == ("parked", 1)
    assert s.store.read(K).parked == 1


def test_parked_calls_wait_in_fifo_order_and_release_promotes_the_oldest(s: Store) -> None:
    take(s, "a", limit=1)
    for n, token in enumerate(["p1", "p2", "p3"], 1):
        out = s.store.acquire(
            K, token, limit=1, lease=LONG, running=False, holder=None, park=queued(f'"{token}"'),
            job_class="", args="", caller=ME,
        )  # fmt: skip
        assert (out.status, out.position) == ("parked", n)
    released = s.store.release(K, "a", caller=ME)
    assert released.status == "released"
    assert [(p.token, p.via, p.payload, p.redo) for p in released.promotions] == [("p1", "queue", '"p1"', 0)]
    state = s.store.read(K)
    assert [(slot.token, slot.status, slot.holder) for slot in state.slots] == [("p1", "promoted", ME)]
    assert [p.token for p in state.head] == ["p2", "p3"]


def test_a_new_call_never_jumps_the_parked_line(s: Store) -> None:
    take(s, "a", limit=1, lease=SHORT)
    take(s, "p1", limit=1, park=queued())
    s.age(SHORT)
    # a's lease lapsed: the settle that runs first gives its slot to p1, not to the newcomer
    assert take(s, "new", limit=1, park=queued()) == "parked"
    assert tokens(s) == ["p1"]


def test_handed_marks_the_promotion_delivered_and_restarts_its_lease(s: Store) -> None:
    take(s, "a", limit=1)
    take(s, "p1", limit=1, park=queued())
    s.store.release(K, "a", caller=ME)
    assert not s.store.handed(K, "p1", OTHER)  # only its promoter may
    assert s.store.handed(K, "p1", ME)
    (slot,) = s.store.read(K).slots
    assert (slot.status, slot.holder) == ("reserved", None)
    assert slot.lease_left > LONG - 5
    assert not s.store.handed(K, "p1", ME)  # once


def test_a_parked_queue_call_never_ages_out(s: Store) -> None:
    take(s, "a", limit=1, running=True, lease=LONG)
    take(s, "p1", limit=1, park=queued(), lease=SHORT)
    s.age(SHORT * 4)
    assert s.store.renew(K, "a", LONG, caller=ME).status == "ok"  # settles the key
    state = s.store.read(K)
    assert [p.token for p in state.head] == ["p1"]
    assert state.oldest_wait is not None and state.oldest_wait >= SHORT * 4 * 0.9


def test_a_lapsed_slot_is_freed_and_its_place_promoted(s: Store) -> None:
    take(s, "a", limit=1, lease=SHORT)
    take(s, "p1", limit=1, park=queued())
    s.age(SHORT)
    out = s.store.renew(K, "p1", LONG, caller=ME)
    assert [p.token for p in out.promotions] == ["p1"]
    assert tokens(s) == ["p1"]


def test_a_promotion_not_handed_over_in_time_is_claimed_again_not_freed(s: Store) -> None:
    take(s, "a", limit=1)
    take(s, "p1", limit=1, park=queued('"call"'))
    s.store.release(K, "a", caller=OTHER, handoff=SHORT)  # OTHER promotes p1, then goes silent
    s.age(SHORT)
    out = s.store.renew(K, "zzz", LONG, caller=ME)
    assert out.status == "gone"
    assert [(p.token, p.payload, p.redo) for p in out.promotions] == [("p1", '"call"', 1)]
    (slot,) = s.store.read(K).slots
    assert (slot.token, slot.status, slot.holder, slot.redo) == ("p1", "promoted", ME, 1)
    assert not s.store.handed(K, "p1", OTHER)  # the old promoter lost it
    assert s.store.handed(K, "p1", ME)


def test_start_runs_a_reserved_or_promoted_slot(s: Store) -> None:
    take(s, "a")
    assert s.store.start(K, "a", holder=ME, lease=LONG, takeover=None, caller=ME).status == "run"
    (slot,) = s.store.read(K).slots
    assert (slot.status, slot.holder) == ("running", ME)
    # a second start of a running slot is a second delivery, even from the same process
    assert s.store.start(K, "a", holder=ME, lease=LONG, takeover=None, caller=ME).status == "busy"


def test_start_by_another_holder_is_busy_unless_taking_over_a_dead_one(s: Store) -> None:
    take(s, "a")
    s.store.start(K, "a", holder=OTHER, lease=LONG, takeover=None, caller=OTHER)
    busy = s.store.start(K, "a", holder=ME, lease=LONG, takeover=None, caller=ME)
    assert (busy.status, busy.holder) == ("busy", OTHER)
    assert s.store.start(K, "a", holder=ME, lease=LONG, takeover=WAITER, caller=ME).status == "busy"
    assert s.store.start(K, "a", holder=ME, lease=LONG, takeover=OTHER, caller=ME).status == "run"
    assert s.store.read(K).slots[0].holder == ME


def test_start_of_a_token_without_a_slot_is_missing(s: Store) -> None:
    assert s.store.start(K, "nope", holder=ME, lease=LONG, takeover=None, caller=ME).status == "missing"
    take(s, "a", lease=SHORT)
    s.age(SHORT)
    assert s.store.start(K, "a", holder=ME, lease=LONG, takeover=None, caller=ME).status == "missing"


def test_release_twice_frees_one_slot_once(s: Store) -> None:
    take(s, "a")
    take(s, "b")
    assert s.store.release(K, "a", caller=ME).status == "released"
    assert s.store.release(K, "a", caller=ME).status == "gone"
    assert tokens(s) == ["b"]


def _pushed_twice_and_started(s: Store, lease: float = LONG, holder: Holder = OTHER) -> None:
    """p1 promoted by OTHER, who went silent: claimed again (a second copy pushed), then one copy runs."""
    take(s, "a", limit=1)
    take(s, "p1", limit=1, park=queued())
    s.store.release(K, "a", caller=OTHER, handoff=SHORT)
    s.age(SHORT)
    s.store.renew(K, "x", LONG, caller=ME)  # claims p1 again: redo 1
    assert s.store.start(K, "p1", holder=holder, lease=lease, takeover=None, caller=holder).status == "run"


def test_a_slot_pushed_twice_is_remembered_after_release(s: Store) -> None:
    _pushed_twice_and_started(s, holder=ME)
    assert s.store.release(K, "p1", caller=ME).status == "released"
    # the other copy of p1, delivered late, is recognised as done and never runs
    assert s.store.start(K, "p1", holder=OTHER, lease=LONG, takeover=None, caller=OTHER).status == "done"
    assert s.store.read(K).empty


def test_requeue_keeps_a_running_slot_reserved_for_the_retry(s: Store) -> None:
    take(s, "a", limit=1)
    take(s, "p1", limit=1, park=queued())
    assert s.store.requeue(K, "a", LONG, holder=ME, caller=ME).status == "gone"  # not running yet
    s.store.start(K, "a", holder=ME, lease=LONG, takeover=None, caller=ME)
    assert s.store.requeue(K, "a", LONG, holder=OTHER, caller=OTHER).status == "gone"  # not OTHER's
    out = s.store.requeue(K, "a", LONG * 2, holder=ME, caller=ME)
    assert (out.status, out.promotions) == ("ok", ())  # kept, so nothing is promoted into it
    state = s.store.read(K)
    (slot,) = state.slots
    assert (slot.token, slot.status, slot.holder) == ("a", "reserved", None)
    assert slot.lease_left > LONG * 2 - 5  # the lease covers the wait for the retry
    assert state.parked == 1
    # the retry runs in it, wherever it is delivered
    assert s.store.start(K, "a", holder=OTHER, lease=LONG, takeover=None, caller=OTHER).status == "run"
    assert s.store.release(K, "a", caller=OTHER).status == "released"
    assert tokens(s) == ["p1"]


def test_inline_waiters_keep_their_place_by_polling_and_lose_it_when_they_stop(s: Store) -> None:
    take(s, "a", limit=1)
    # Leases with room for a call on a loaded machine beside each age (Redis: the server's clock).
    waiting = Park("inline", holder=WAITER, lease=SHORT * 4)
    assert take(s, "w", limit=1, park=waiting) == "parked"
    for _ in range(3):
        s.age(SHORT)
        out = s.store.start(K, "w", holder=WAITER, lease=SHORT * 4, takeover=None, caller=WAITER)
        assert out.status == "parked"  # each poll by the waiter renews its place
    # a poll by anyone else does not
    s.store.start(K, "w", holder=ME, lease=LONG, takeover=None, caller=ME)
    s.age(SHORT * 4)
    assert s.store.start(K, "w", holder=WAITER, lease=SHORT, takeover=None, caller=WAITER).status == "missing"
    assert s.store.read(K).parked == 0


def test_an_inline_promotion_is_held_by_its_waiter_who_starts_it(s: Store) -> None:
    take(s, "a", limit=1)
    take(s, "w", limit=1, park=Park("inline", holder=WAITER, lease=LONG))
    out = s.store.release(K, "a", caller=ME)
    assert [(p.token, p.via, p.payload) for p in out.promotions] == [("w", "inline", "")]
    (slot,) = s.store.read(K).slots
    assert (slot.status, slot.via, slot.holder) == ("promoted", "inline", WAITER)
    assert s.store.start(K, "w", holder=WAITER, lease=LONG, takeover=None, caller=WAITER).status == "run"


def test_renew_extends_slots_and_inline_places_only(s: Store) -> None:
    # The leases leave room for the calls between taking and renewing on a loaded
    # machine (on Redis they run on the server's clock); the last age outlasts them.
    take(s, "a", limit=1, lease=SHORT * 6)
    take(s, "q", limit=1, park=queued())
    take(s, "w", limit=1, park=Park("inline", holder=WAITER, lease=SHORT * 6))
    s.age(SHORT)
    assert s.store.renew(K, "a", LONG, caller=ME).status == "ok"
    assert s.store.renew(K, "w", LONG, caller=ME).status == "ok"
    assert s.store.renew(K, "q", LONG, caller=ME).status == "ok"  # parked for a queue: nothing to renew
    s.age(SHORT * 6)
    state = s.store.read(K)
    assert [slot.token for slot in state.slots] == ["a"]
    assert [p.token for p in state.head] == ["q", "w"]
    assert s.store.renew(K, "nope", LONG, caller=ME).status == "gone"


def test_withdraw(s: Store) -> None:
    take(s, "a", limit=1)
    take(s, "w", limit=1, park=Park("inline", holder=WAITER, lease=LONG))
    assert s.store.withdraw(K, "w").status == "withdrawn"
    assert s.store.withdraw(K, "w").status == "gone"
    assert s.store.withdraw(K, "a").status == "slot"
    assert s.store.read(K).parked == 0


def _only_the_other_copy_runs(s: Store) -> None:
    (slot,) = s.store.read(K).slots
    assert (slot.token, slot.status, slot.holder, slot.redo) == ("p1", "reserved", None, 1)  # kept for it
    assert s.store.start(K, "p1", holder=ME, lease=LONG, takeover=None, caller=ME).status == "run"
    assert s.store.release(K, "p1", caller=ME).status == "released"
    # a third delivery (the dead run's retry, or the copy that found it running) never runs
    assert s.store.start(K, "p1", holder=WAITER, lease=LONG, takeover=None, caller=WAITER).status == "done"
    assert s.store.read(K).empty


def test_a_dead_runner_s_slot_pushed_twice_is_kept_for_the_other_copy(s: Store) -> None:
    """Freed outright, each later copy took a new slot and ran: the job ran twice (seen in the races)."""
    _pushed_twice_and_started(s)
    out = s.store.reap(K, [("p1", OTHER)], caller=ME)  # its runner died
    assert out.count == 1
    _only_the_other_copy_runs(s)


#: A run's lease that lapses within a test (Redis ages on its own clock: the test sleeps), yet is
#: long enough for the next steps to come before the slot kept after it lapses too.
RUN = 2.0


def test_a_lapsed_run_s_slot_pushed_twice_is_kept_for_the_other_copy(s: Store) -> None:
    _pushed_twice_and_started(s, lease=RUN)
    s.age(RUN)  # its runner stopped renewing
    s.store.renew(K, "x", LONG, caller=ME)  # settles
    _only_the_other_copy_runs(s)
    take(s, "b", limit=1)


def test_a_slot_kept_for_another_copy_is_freed_after_a_lease(s: Store) -> None:
    _pushed_twice_and_started(s, lease=RUN)
    s.store.reap(K, [("p1", OTHER)], caller=ME)
    s.age(RUN)
    s.store.renew(K, "x", LONG, caller=ME)  # settles: no copy came
    assert s.store.read(K).empty
    assert s.store.start(K, "p1", holder=ME, lease=LONG, takeover=None, caller=ME).status == "missing"


def test_reap_frees_dead_holders_only_while_they_still_hold(s: Store) -> None:
    take(s, "a", limit=2, running=True)  # held by ME
    take(s, "b", limit=2)
    take(s, "p1", limit=2, park=queued())
    take(s, "w", limit=2, park=Park("inline", holder=WAITER, lease=LONG))
    out = s.store.reap(K, [("a", OTHER), ("b", OTHER)], caller=ME)  # wrong holders: untouched
    assert (out.count, out.promotions) == (0, ())
    out = s.store.reap(K, [("w", WAITER), ("a", ME)], caller=ME)
    assert out.count == 2
    assert [p.token for p in out.promotions] == ["p1"]
    assert tokens(s) == ["b", "p1"]
    assert s.store.read(K).parked == 0


def test_reap_claims_a_dead_promoters_promotion_again(s: Store) -> None:
    take(s, "a", limit=1)
    take(s, "p1", limit=1, park=queued('"call"'))
    s.store.release(K, "a", caller=OTHER)
    out = s.store.reap(K, [("p1", OTHER)], caller=ME)
    assert out.count == 0
    assert [(p.token, p.redo) for p in out.promotions] == [("p1", 1)]
    assert s.store.read(K).slots[0].holder == ME


def test_discard_parked_drops_the_line_and_keeps_the_slots(s: Store) -> None:
    take(s, "a", limit=1)
    take(s, "p1", limit=1, park=queued())
    take(s, "w", limit=1, park=Park("inline", holder=WAITER, lease=LONG))
    assert s.store.discard_parked(K) == [("p1", "{}"), ("w", "")]
    assert s.store.discard_parked(K) == []
    state = s.store.read(K)
    assert (state.parked, tokens(s)) == (0, ["a"])
    assert s.store.start(K, "w", holder=WAITER, lease=LONG, takeover=None, caller=WAITER).status == "missing"


def test_drop_frees_the_named_slots_and_promotes_no_further_than_the_limit(s: Store) -> None:
    for token in "ab":
        take(s, token)
    for token in ["p1", "p2", "p3"]:
        take(s, token, park=queued())
    take(s, "late")  # parked too: the key is full
    out = s.store.drop(K, ["a", "b", "unknown"], caller=ME)
    assert out.count == 2
    assert [p.token for p in out.promotions] == ["p1", "p2"]
    assert tokens(s) == ["p1", "p2"]
    assert s.store.read(K).parked == 1


def test_a_lowered_limit_takes_effect_as_slots_free(s: Store) -> None:
    for token in "abc":
        take(s, token, limit=3)
    take(s, "p1", limit=1, park=queued())  # the class now says 1
    s.store.release(K, "a", caller=ME)
    s.store.release(K, "b", caller=ME)
    assert tokens(s) == ["c"]
    out = s.store.release(K, "c", caller=ME)
    assert [p.token for p in out.promotions] == ["p1"]


def test_a_delayed_jobs_lease_covers_its_delay(s: Store) -> None:
    take(s, "later", lease=LONG + 3600)
    assert s.store.read(K).slots[0].lease_left > 3600


def test_read_and_scan(s: Store) -> None:
    assert list(s.store.scan()) == []
    empty = s.store.read(K)
    assert empty.empty and empty.oldest_wait is None
    take(s, "a", limit=1)
    take(s, "p1", limit=1, park=queued())
    take(s, "z", limit=1, key="jobs.Export:acct-2")
    state = s.store.read(K, head=1)
    assert (state.limit, state.job_class, state.parked, len(state.head)) == (1, "jobs.Export", 1, 1)
    assert state.slots[0].args == "('a')"
    assert sorted(s.store.scan()) == [K, "jobs.Export:acct-2"]
    s.store.release(K, "a", caller=ME)
    s.store.release(K, "p1", caller=ME)
    assert list(s.store.scan()) == ["jobs.Export:acct-2"]


def test_the_key_space_is_separate_from_the_uniqueness_locks(s: Store) -> None:
    take(s, "a")
    backend = s.backend
    assert isinstance(backend, Backend)
    assert list(backend.scan()) == []
    assert backend.read(K).free


def test_redis_keys_share_one_hash_tag_and_carry_no_expiry_while_parked(redis_backend: RedisBackend) -> None:
    store = store_for(redis_backend)
    for token, park in [("a", None), ("p1", Park("queue", "{}"))]:
        store.acquire(
            K,
            token,
            limit=1,
            lease=LONG,
            running=False,
            holder=None,
            park=park,
            job_class="",
            args="",
            caller=ME,
        )
    names = sorted(n.decode() if isinstance(n, bytes) else n for n in redis_backend.client.keys("*"))
    prefix = f"{redis_backend.namespace}:c:{{{K}}}:"
    assert names == [prefix + part for part in ("entries", "meta", "parked", "slots")]
    assert all(redis_backend.client.pttl(name) == -1 for name in names)  # a parked job never ages out


def test_file_store_lives_apart_and_refuses_an_unreadable_record(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "locks")
    store = store_for(backend)
    assert isinstance(store, FileSemaphores)
    assert store.directory == tmp_path / "locks" / "concurrency"
    store.acquire(
        K, "a", limit=1, lease=LONG, running=False, holder=None, park=None, job_class="", args="", caller=ME
    )
    (record,) = store.directory.glob("*.json")
    record.write_text("{not json")
    with pytest.raises(CorruptRecordError, match=r"\.json: not valid JSON"):
        store.read(K)
    assert list(store.scan()) == []  # skipped, with a warning


def test_file_store_writes_under_one_reused_temporary_name_per_stripe(tmp_path: Path) -> None:
    store = FileSemaphores(tmp_path)
    assert isinstance(store._stripes._lock(0), _StripeLock)  # the file backend's flock, kept open
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child dies mid-write, as a crash would
        os.replace = lambda *args: os._exit(0)
        store.acquire(
            K,
            "a",
            limit=1,
            lease=LONG,
            running=False,
            holder=None,
            park=None,
            job_class="",
            args="",
            caller=ME,
        )
        os._exit(1)
    assert os.waitpid(pid, 0)[1] == 0
    (left,) = tmp_path.glob(".*.tmp")  # what the crash left behind
    for token in ("a", "b", "c"):
        take_file = store.acquire(
            K, token, limit=3, lease=LONG, running=False, holder=None, park=None, job_class="", args="",
            caller=ME,
        )  # fmt: skip
        assert take_file.status == "taken"
    assert list(tmp_path.glob("*.tmp")) == list(tmp_path.glob(".*.tmp")) == []  # written over, renamed away
    assert sorted(slot.token for slot in store.read(K).slots) == ["a", "b", "c"]
    assert left.name.endswith(".tmp")


def test_one_store_per_backend_object(tmp_path: Path) -> None:
    backend = MemoryBackend()
    assert store_for(backend) is store_for(backend)
    assert store_for(MemoryBackend()) is not store_for(backend)


def test_each_store_offers_its_semaphores_beside_its_locks(
    tmp_path: Path, redis_backend: RedisBackend
) -> None:
    from uniqjob.stores.memory import MemorySemaphores
    from uniqjob.stores.redis._semaphores import RedisSemaphores

    clock = FakeClock()
    memory = MemoryBackend(clock=clock)
    files = FileBackend(tmp_path / "locks", timeout=7.0, clock=clock)
    kept = memory.semaphores(), files.semaphores(), redis_backend.semaphores()
    assert [type(store) for store in kept] == [MemorySemaphores, FileSemaphores, RedisSemaphores]
    assert isinstance(kept[1], FileSemaphores)
    assert (kept[1].directory, kept[1].timeout) == (tmp_path / "locks" / "concurrency", 7.0)
    assert isinstance(kept[2], RedisSemaphores)
    assert (kept[2].client, kept[2].namespace) == (redis_backend.client, redis_backend.namespace)
    take_memory = kept[0].acquire(
        K, "a", limit=1, lease=1.0, running=False, holder=None, park=None, job_class="", args="", caller=ME,
    )  # fmt: skip
    assert take_memory.status == "taken"
    clock.advance(2.0)  # the backend's clock, followed by its semaphores
    (slot,) = kept[0].read(K).slots
    assert slot.lease_left == -1.0


def test_a_backend_that_keeps_no_slots_says_so() -> None:
    from uniqjob.errors import ConfigurationError

    class Bare(MemoryBackend):
        def semaphores(self) -> SemaphoreStore:
            return super(MemoryBackend, self).semaphores()  # the contract's: none

    class Wrong(MemoryBackend):
        def semaphores(self) -> SemaphoreStore:
            return object()  # type: ignore[return-value]

    with pytest.raises(ConfigurationError, match="Bare keeps no concurrency slots"):
        store_for(Bare())
    with pytest.raises(ConfigurationError, match=r"semaphores\(\) returned object, not a SemaphoreStore"):
        store_for(Wrong())


def test_a_promotion_that_cannot_be_pushed_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    from uniqjob.concurrency import semaphore
    from uniqjob.stores.semaphores import Promotion

    store = MemoryBackend().semaphores()
    with caplog.at_level("ERROR", logger="uniqjob.concurrency.semaphore"):
        assert semaphore.deliver(store, K, [Promotion("t2", "queue", "{}", 0)], ME) == 0
    assert "could not hand parked job t2" in caplog.text


def _damage(s: Store, key: str) -> bool:
    """Make ``key``'s slot record unreadable in the store; False if the store has no record to damage."""
    store = s.store
    if isinstance(store, RedisSemaphores):
        assert store.client.hset(store._keys(key)[0], "a", "{not json") == 0  # the slot of "a": there already
        return True
    if isinstance(store, FileSemaphores):
        for path in store.directory.glob("*.json"):
            if json.loads(path.read_text()).get("key") == key:
                path.write_text("{not json")
                return True
        raise AssertionError(f"no record of {key!r} under {store.directory}")
    return False  # the memory and dict stores hold Python objects


def _facts(state: SemaphoreState | CorruptRecordError) -> tuple[object, ...]:
    """What a read found, less the times left (they run down between two reads)."""
    if isinstance(state, CorruptRecordError):
        return ("corrupt", state.path, state.key, state.reason)
    slots = [(x.token, x.status, x.via, x.holder, x.since, x.lease, x.redo, x.args) for x in state.slots]
    return (state.key, state.limit, state.job_class, sorted(slots), state.parked, state.head)


def test_read_many_reads_each_key_as_read_does(s: Store) -> None:
    assert s.store.read_many([]) == []
    for n in range(3):
        for token in ("a", "b", "c"):
            assert take(s, token, limit=1, park=queued(f"{{{token}}}"), key=f"k{n}") in ("taken", "parked")
    assert take(s, "a", limit=1, key="damaged") == "taken"
    damaged = _damage(s, "damaged")
    asked = ["k0", "damaged", "free", "k1", "{brace}", "k2"]
    many = s.store.read_many(asked, head=1)
    one: list[SemaphoreState | CorruptRecordError] = []
    for key in asked:
        try:
            one.append(s.store.read(key, head=1))
        except CorruptRecordError as exc:
            one.append(exc)
    assert [_facts(x) for x in many] == [_facts(x) for x in one]
    assert isinstance(many[1], CorruptRecordError) == damaged
    assert all(isinstance(x, SemaphoreState) and x.empty for x in (many[2], many[4]))
    for state in (many[0], many[3], many[5]):
        assert isinstance(state, SemaphoreState)
        assert (len(state.slots), state.parked, [p.token for p in state.head]) == (1, 2, ["b"])
