"""The backend contract: every store keeps it, so policy can live once above them.

Each test runs against every store in ``tests/conftest.py``'s ``STORES``. Time
moves through ``Store.advance``: the file, memory and dict stores take an
injected clock; Redis keeps the server's clock, so there leases are short and
the test waits them out.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.conftest import STORES, FakeClock, make_store
from tests.support.dictstore import DictBackend
from uniqjob.errors import ConfigurationError, CorruptRecordError
from uniqjob.locks import Holder, LockState, QueueMeta, RunClaim
from uniqjob.stores import LockMachine
from uniqjob.stores._records import Fences
from uniqjob.stores.base import Backend
from uniqjob.stores.file import FileBackend
from uniqjob.stores.redis import RedisBackend

ME = Holder("host-a", "node-a", os.getpid(), 1)
OTHER = Holder("host-b", "node-b", 4242, 7)
META = QueueMeta("tests.Job", "(1,)", "job-1")
LEASE = 0.25  # short enough that Redis tests can wait one out


@dataclass
class Store:
    backend: Backend
    advance: Callable[[float], None]


@pytest.fixture(params=list(STORES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    clock = FakeClock()
    backend = make_store(request, tmp_path, clock)
    return Store(backend, clock.advance if STORES[request.param].fake_clock else time.sleep)


def claim(b: Backend, token: str, key: str = "k", **kw: object) -> LockState | None:
    return b.claim(key, token, meta=META, **kw)  # type: ignore[arg-type]


def start(b: Backend, token: str, holder: Holder = ME, key: str = "k", **kw: object) -> LockState | None:
    return b.start(key, token, run=RunClaim(holder, LEASE), meta=META, **kw)  # type: ignore[arg-type]


def test_claim_records_state_and_conflicts(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    conflict = claim(b, "t2")
    assert conflict is not None and conflict.queue is not None
    assert conflict.queue.token == "t1" and conflict.queue.state == "queued"
    assert conflict.queue.meta == META
    assert conflict.queue.ttl is None and conflict.run is None
    state = b.read("k")
    assert state.queue is not None and state.queue.since <= state.now
    assert b.read("other").free


def test_a_conflict_has_nothing_to_reclaim_only_when_queued_without_a_job(store: Store) -> None:
    b = store.backend
    plain = QueueMeta("tests.Job", "(1,)")
    assert b.claim("q", "t1", meta=plain) is None
    settled = b.claim("q", "t2", meta=plain)
    assert (
        settled is not None
        and settled.nothing_to_reclaim
        and settled.queue is not None
        and settled.queue.token == "t1"
    )
    assert b.attach("q", "t1", "job-9")  # now a queue may prove its job gone
    named = b.claim("q", "t3", meta=plain)
    assert named is not None and not named.nothing_to_reclaim
    assert start(b, "t4", key="r") is None  # running
    running = b.claim("r", "t5", meta=plain)
    assert running is not None and not running.nothing_to_reclaim


def test_store_clock_is_used(store: Store) -> None:
    # Redis reports its own TIME; the injected clocks start far in the future of the wall clock.
    state = store.backend.read("k")
    if isinstance(store.backend, RedisBackend):
        assert abs(state.now - time.time()) < 5
    else:
        assert state.now == FakeClock().now


def test_start_moves_queue_lock_to_running(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    assert start(b, "t1") is None
    state = b.read("k")
    assert state.queue is not None and state.queue.state == "running" and state.queue.token == "t1"
    assert state.run is not None and state.run.token == "t1" and state.run.holder == ME
    assert 0 < state.run.lease_left <= LEASE and state.run.lease == LEASE
    b.finish("k", "t1")
    assert b.read("k").free


def test_start_conflicts_with_live_run_lock(store: Store) -> None:
    b = store.backend
    assert start(b, "t1") is None
    conflict = start(b, "t2", OTHER)
    assert conflict is not None and conflict.run is not None and conflict.run.holder == ME
    # the same token again (a redelivered job) renews instead of conflicting
    assert start(b, "t1") is None


def test_start_creates_missing_queue_lock_with_ttl(store: Store) -> None:
    b = store.backend
    assert start(b, "t1", ttl=100) is None
    state = b.read("k")
    assert state.queue is not None and state.queue.state == "running"
    assert state.queue.ttl is not None and 99 < state.queue.ttl <= 100


def test_start_leaves_a_successors_queue_lock_alone(store: Store) -> None:
    b = store.backend
    assert claim(b, "successor") is None
    assert start(b, "old") is None
    state = b.read("k")
    assert state.queue is not None and state.queue.token == "successor" and state.queue.state == "queued"
    b.finish("k", "old")
    state = b.read("k")
    assert state.run is None and state.queue is not None and state.queue.token == "successor"


def test_start_adopts_any_queued_lock_when_asked(store: Store) -> None:
    b = store.backend
    assert claim(b, "enqueuer") is None
    assert start(b, "worker", adopt=True) is None
    state = b.read("k")
    assert state.queue is not None and state.queue.token == "worker" and state.queue.state == "running"
    b.finish("k", "worker")
    assert b.read("k").free


def test_finish_releases_only_own_locks(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    assert start(b, "t1") is None
    b.finish("k", "intruder")
    assert not b.read("k").free
    b.finish("k", "t1")
    assert b.read("k").free


def test_renew_only_own_lock_and_extends_lease(store: Store) -> None:
    b = store.backend
    assert start(b, "t1") is None
    store.advance(LEASE * 0.6)
    assert b.renew("k", "t1", LEASE)
    assert not b.renew("k", "t2", LEASE)
    store.advance(LEASE * 0.6)  # past the first lease, inside the renewed one
    state = b.read("k")
    assert state.run is not None and state.run.token == "t1"
    store.advance(LEASE * 0.6)
    assert b.read("k").run is None
    assert not b.renew("k", "t1", LEASE)  # lapsed: gone for good


def test_lapsed_run_lock_makes_running_queue_lock_an_orphan(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    assert start(b, "t1", OTHER) is None
    assert claim(b, "t2") is not None  # live
    store.advance(LEASE * 1.5)
    assert claim(b, "t2") is None  # reclaimed, then taken
    state = b.read("k")
    assert state.queue is not None and state.queue.token == "t2" and state.queue.state == "queued"
    b.finish("k", "t1")  # the dead job, back from a stall, cannot release its successor
    assert b.read("k").queue is not None


def test_queued_lock_is_never_reclaimed_by_the_orphan_rule(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    store.advance(LEASE * 1.5)
    assert claim(b, "t2") is not None


def test_autoexpire_bounds_queue_lock_only(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1", ttl=LEASE) is None
    assert start(b, "t1", OTHER) is None
    store.advance(LEASE * 0.6)
    assert b.renew("k", "t1", LEASE)
    store.advance(LEASE * 0.6)
    state = b.read("k")
    assert state.queue is None and state.run is not None  # queue lock expired, job still running
    assert claim(b, "t2") is None  # so an enqueue succeeds
    assert start(b, "t2") is not None  # but it cannot run while the first one does
    b.finish("k", "t1")  # the old job cannot release the new queue lock
    state = b.read("k")
    assert state.queue is not None and state.queue.token == "t2" and state.run is None
    assert start(b, "t2") is None


def test_claim_with_run_takes_both_in_one_step(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1", run=RunClaim(ME, LEASE)) is None
    state = b.read("k")
    assert state.queue is not None and state.queue.state == "running"
    assert state.run is not None and state.run.token == "t1"
    assert claim(b, "t2", run=RunClaim(ME, LEASE)) is not None


def test_claim_with_run_conflicts_with_lone_run_lock(store: Store) -> None:
    b = store.backend
    assert start(b, "t1", OTHER, ttl=LEASE / 2) is None
    store.advance(LEASE * 0.6)  # the queue lock autoexpired; the run lock lives on
    assert b.read("k").queue is None
    conflict = claim(b, "t2", run=RunClaim(ME, LEASE))
    assert conflict is not None and conflict.run is not None
    assert b.read("k").queue is None  # nothing half-taken


def test_dequeue_only_queued(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    assert not b.dequeue("k", "other")
    assert b.dequeue("k", "t1")
    assert b.read("k").free
    assert claim(b, "t2") is None
    assert start(b, "t2") is None
    assert not b.dequeue("k")  # running: left to its holder
    assert not b.read("k").free


def test_reclaim_checks_tokens(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    assert start(b, "t1") is None
    assert not b.reclaim("k", "old", "old")
    assert b.reclaim("k", "t1", None)
    state = b.read("k")
    assert state.queue is None and state.run is not None
    assert b.reclaim("k", None, "t1")
    assert b.read("k").free


def test_scan_lists_every_held_key(store: Store) -> None:
    b = store.backend
    for i in range(30):
        assert claim(b, "t", key=f"key:{i}") is None
    assert start(b, "t", key="lone", ttl=LEASE / 2) is None
    store.advance(LEASE * 0.6)  # "lone" keeps only its run lock
    b.finish("key:3", "t")
    keys = sorted(b.scan())
    assert keys == sorted([f"key:{i}" for i in range(30) if i != 3] + ["lone"])


def test_keys_with_braces_and_unicode(store: Store) -> None:
    b = store.backend
    key = "job:{weird}}:ключ:🙂"
    assert claim(b, "t", key=key) is None
    assert claim(b, "u", key=key) is not None
    assert list(b.scan()) == [key]


def test_attach_records_job_id_only_on_own_lock(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    assert b.attach("k", "t1", "rq-42")
    assert not b.attach("k", "other", "rq-43")
    state = b.read("k")
    assert state.queue is not None and state.queue.meta.job_id == "rq-42"
    assert not b.attach("missing", "t1", "x")


def test_same_token_other_attempt_is_a_second_delivery(store: Store) -> None:
    b = store.backend
    first = RunClaim(ME, LEASE, "delivery-1")
    assert b.start("k", "t1", run=first, meta=META) is None
    assert b.start("k", "t1", run=first, meta=META) is None  # the same attempt renews
    conflict = b.start("k", "t1", run=RunClaim(ME, LEASE, "delivery-2"), meta=META)
    assert conflict is not None and conflict.run is not None and conflict.run.token == "t1"
    store.advance(LEASE * 1.5)  # its lease lapsed: the job may run again
    assert b.start("k", "t1", run=RunClaim(ME, LEASE, "delivery-2"), meta=META) is None


def test_requeue_turns_a_run_into_a_queued_wait(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1", ttl=LEASE) is None
    assert b.attach("k", "t1", "job-7")
    assert start(b, "t1") is None
    assert b.requeue("k", "t1", meta=META, ttl=100)
    state = b.read("k")
    assert state.run is None and state.queue is not None
    assert (state.queue.state, state.queue.token, state.queue.meta.job_id) == ("queued", "t1", "job-7")
    assert state.queue.ttl is not None and state.queue.ttl > 50  # counted afresh
    assert claim(b, "t2") is not None  # duplicates still conflict while the retry waits
    assert b.requeue("k", "t1", meta=META, ttl=None)
    assert b.read("k").queue.ttl is None  # type: ignore[union-attr]


def test_requeue_recreates_a_missing_queue_lock_but_never_takes_anothers(store: Store) -> None:
    b = store.backend
    assert start(b, "t1", queue_lock="release") is None  # until_and_while: no queue lock while running
    assert b.requeue("k", "t1", meta=META, ttl=None)
    state = b.read("k")
    assert state.queue is not None and state.queue.token == "t1" and state.queue.state == "queued"
    b.finish("k", "t1")
    assert claim(b, "t2") is None
    assert start(b, "t1", queue_lock="keep") is None
    assert not b.requeue("k", "t1", meta=META, ttl=None)  # t2's queued lock is left alone
    state = b.read("k")
    assert state.run is None and state.queue is not None and state.queue.token == "t2"


# Fences, idempotent retries and purge: the promise through faults (issue 10).


def _grant(b: Backend, token: str, attempt: str = "", key: str = "k") -> int:
    """Take the run lock of ``key`` for ``token`` and return the fence the store issued."""
    run = RunClaim(ME, LEASE, attempt)
    assert b.start(key, token, run=run, meta=META) is None
    assert run.fence > 0
    return run.fence


def test_fences_strictly_increase_across_claims_starts_and_releases(backend: Backend) -> None:
    fences = []
    for i in range(4):
        run = RunClaim(ME, LEASE, "a")
        assert backend.claim("k", f"c{i}", meta=META, run=run) is None
        fences.append(run.fence)
        backend.finish("k", f"c{i}")
        fences.append(_grant(backend, f"s{i}"))
        backend.finish("k", f"s{i}")
    assert all(f > 0 for f in fences)
    assert fences == sorted(set(fences))  # strictly increasing: no fence twice, never smaller


def test_the_fence_is_recorded_in_the_run_lock_and_survives_release(backend: Backend) -> None:
    first = _grant(backend, "t1")
    state = backend.read("k")
    assert state.run is not None and state.run.fence == first
    backend.finish("k", "t1")
    assert backend.read("k").free
    assert _grant(backend, "t2") > first  # the store remembers the last fence past the release
    assert _grant(backend, "t3", key="other") > 0  # and keeps one sequence per key


def test_a_retried_grant_gets_the_fence_it_already_holds(backend: Backend) -> None:
    first = _grant(backend, "t1", "a1")
    assert _grant(backend, "t1", "a1") == first  # start again: the same run, the same fence
    backend.finish("k", "t1")
    run = RunClaim(ME, LEASE, "a2")
    assert backend.claim("k", "t2", meta=META, run=run) is None
    again = RunClaim(ME, LEASE, "a2")
    assert backend.claim("k", "t2", meta=META, run=again) is None  # a retry after a lost reply
    assert again.fence == run.fence > first
    state = backend.read("k")
    assert state.run is not None and state.run.fence == run.fence and state.run.token == "t2"


def test_a_claim_is_idempotent_for_its_token(backend: Backend) -> None:
    assert claim(backend, "t1") is None
    assert claim(backend, "t1") is None  # its own lock, found again: taken, not a duplicate
    conflict = claim(backend, "t2")
    assert conflict is not None and conflict.queue is not None and conflict.queue.token == "t1"
    state = backend.read("k")
    assert state.queue is not None and state.queue.token == "t1" and state.queue.state == "queued"
    backend.finish("k", "t1")
    assert backend.read("k").free  # one lock, released once


def test_a_retried_run_claim_never_takes_anothers_run_lock(backend: Backend) -> None:
    assert claim(backend, "t1", ttl=100) is None
    assert backend.start("k", "t2", run=RunClaim(OTHER, LEASE, "x"), meta=META, queue_lock="keep") is None
    conflict = backend.claim("k", "t1", meta=META, run=RunClaim(ME, LEASE, "a"))
    assert conflict is not None and conflict.run is not None and conflict.run.token == "t2"
    # nor its own token's run lock of another attempt (a second delivery)
    backend.finish("k", "t2")
    backend.finish("k", "t1")
    assert backend.claim("k", "t3", meta=META, run=RunClaim(ME, LEASE, "a1")) is None
    second = backend.claim("k", "t3", meta=META, run=RunClaim(ME, LEASE, "a2"))
    assert second is not None and second.run is not None


def test_purge_removes_a_held_lock_and_the_fence_still_increases(backend: Backend) -> None:
    run = RunClaim(ME, LEASE, "a")
    assert backend.claim("k", "t1", meta=META, run=run) is None
    assert claim(backend, "t1", key="other") is None
    gone = backend.purge("k")
    assert gone and all(isinstance(name, str) and name for name in gone)
    assert backend.read("k").free
    assert sorted(backend.scan()) == ["other"]
    assert backend.purge("k") == []  # nothing left to remove
    assert _grant(backend, "t2") > run.fence  # fences stay increasing past a purge
    assert not backend.read("other").free


class _NoFences(DictBackend):
    """A record-machine store whose hook forgets the fence issuer: a store author's mistake."""

    @contextmanager
    def _lock_machine(self, key: str) -> Iterator[LockMachine]:
        with super()._lock_machine(key) as locks:
            locks.fences = self.issuer
            yield locks

    issuer: Fences | None = None


@pytest.mark.parametrize(
    ("issuer", "problem"),
    [
        (
            None,
            "has no fence issuer, so it cannot grant a run lock: a store's _lock_machine hook passes fences=",
        ),
        (
            lambda now_us: 0,
            "fence issuer of the lock machine of 'k' returned 0: a fence is a whole number > 0",
        ),
        (lambda now_us: "7", "returned '7': a fence is a whole number > 0"),
    ],
    ids=["no-issuer", "zero", "not-an-int"],
)
def test_a_record_machine_store_without_a_real_fence_refuses_to_grant(
    issuer: Fences | None, problem: str
) -> None:
    backend = _NoFences()
    backend.issuer = issuer
    with pytest.raises(ConfigurationError, match=re.escape(problem)):
        backend.start("k", "t1", run=RunClaim(ME, LEASE), meta=META)
    with pytest.raises(ConfigurationError, match=re.escape(problem)):
        backend.claim("k", "t1", meta=META, run=RunClaim(ME, LEASE))
    assert backend.read("k").free and backend.records == {}  # nothing was stored, no fence 0 issued
    assert claim(backend, "t1") is None and backend.dequeue("k", "t1")  # what needs no fence still works


# Attempts: two deliveries of one job share its token; each settles only its own run.


def _deliver(b: Backend, attempt: str, lease: float = LEASE, token: str = "t1") -> None:
    """Start delivery ``attempt`` of the job ``token`` (its queue lock moves to running)."""
    assert b.start("k", token, run=RunClaim(ME, lease, attempt), meta=META) is None


def _held_by(b: Backend, attempt_lease: float, token: str = "t1") -> None:
    """Assert that ``token`` still holds both locks: its run (lease ``attempt_lease``) and the queue lock."""
    state = b.read("k")
    assert state.run is not None and state.run.token == token and state.run.lease == attempt_lease
    assert state.queue is not None and (state.queue.token, state.queue.state) == (token, "running")
    assert claim(b, "t-new", run=RunClaim(OTHER, LEASE, "n")) is not None  # no other run can start


def test_a_second_delivery_leaves_the_first_deliverys_locks(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    _deliver(b, "a1", lease=30.0)
    assert b.start("k", "t1", run=RunClaim(ME, LEASE, "a2"), meta=META) is not None  # a2 is refused
    # a2 settles its failed start every way it may: a1's locks stay, untouched.
    assert not b.renew("k", "t1", 90.0, attempt="a2")
    assert not b.requeue("k", "t1", meta=META, ttl=None, attempt="a2")
    b.finish("k", "t1", attempt="a2")
    b.finish("k", "t1", keep_queue=True, attempt="a2")
    _held_by(b, 30.0)
    assert b.renew("k", "t1", 60.0, attempt="a1")  # a1's own renewal still works
    _held_by(b, 60.0)
    b.finish("k", "t1", attempt="a1")  # and a1's own finish releases both
    assert b.read("k").free


def test_the_delivery_that_retook_a_lapsed_run_keeps_it_when_the_first_ends(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    _deliver(b, "a1")
    store.advance(LEASE * 1.5)  # a1's beat stalled: its lease lapsed on the store
    _deliver(b, "a2", lease=30.0)  # the queue redelivered the job
    b.finish("k", "t1", attempt="a1")  # a1's perform ends late
    assert not b.renew("k", "t1", LEASE, attempt="a1")
    assert not b.requeue("k", "t1", meta=META, ttl=None, attempt="a1")
    _held_by(b, 30.0)
    b.finish("k", "t1", attempt="a2")
    assert b.read("k").free


def test_an_attempt_settles_its_own_run(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    _deliver(b, "a1")
    b.finish("k", "t1", keep_queue=True, attempt="a1")  # until_expired: the queue lock stays
    state = b.read("k")
    assert state.run is None and state.queue is not None and state.queue.token == "t1"
    _deliver(b, "a2")
    assert b.requeue("k", "t1", meta=META, ttl=None, attempt="a2")  # a retry of a2's own run
    state = b.read("k")
    assert state.run is None and state.queue is not None and state.queue.state == "queued"
    b.finish("k", "t1", attempt="a2")  # no run lock left: the token's queue lock goes, as before
    assert b.read("k").free


def test_a_run_lock_that_names_no_attempt_is_every_attempts(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    _deliver(b, "", lease=30.0)  # taken by a caller with no attempt
    assert b.renew("k", "t1", 60.0, attempt="a1")
    _held_by(b, 60.0)
    b.finish("k", "t1", attempt="a1")
    assert b.read("k").free


def test_without_an_attempt_the_token_alone_decides(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    _deliver(b, "a1", lease=30.0)
    assert b.renew("k", "t1", 60.0)  # any run lock of the token, whichever attempt took it
    assert b.requeue("k", "t1", meta=META, ttl=None)
    state = b.read("k")
    assert state.run is None and state.queue is not None and state.queue.state == "queued"
    _deliver(b, "a2")
    b.finish("k", "t1")
    assert b.read("k").free
    assert not b.renew("k", "t2", LEASE, attempt="a1")  # and another token is never ours


# -- dropped duplicates (Backend.duplicates) ----------------------------------------------------


def test_a_counted_refusal_is_a_duplicate_of_its_class(store: Store) -> None:
    b = store.backend
    assert b.duplicates() == {}
    assert claim(b, "t1", count=True) is None  # a grant counts nothing
    assert claim(b, "t2", count=True) is not None
    assert claim(b, "t3", count=True) is not None
    assert claim(b, "t4") is not None  # not asked to count
    other = QueueMeta("tests.Other")  # a class of its own has keys of its own
    assert b.claim("o", "t5", meta=other) is None
    assert b.claim("o", "t9", meta=other, count=True) is not None
    assert b.claim("k", "t6", meta=QueueMeta(), count=True) is not None  # no class: not attributable
    assert start(b, "t7", key="r") is None
    assert start(b, "t8", key="r", count=True) is not None  # a refused start counts too
    assert b.duplicates() == {"tests.Job": 3, "tests.Other": 1}


def test_a_second_delivery_is_not_a_duplicate(store: Store) -> None:
    b = store.backend
    assert b.start("k", "t1", run=RunClaim(ME, LEASE, "a1"), meta=META) is None
    assert b.start("k", "t1", run=RunClaim(ME, LEASE, "a2"), meta=META, count=True) is not None
    assert b.duplicates() == {}


def test_a_refusal_resolved_and_retaken_is_taken_back(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    refused = claim(b, "t2", count=True)
    assert refused is not None and b.duplicates() == {"tests.Job": 1}
    assert b.reclaim("k", "t1", None)  # the caller proved the holder gone
    assert claim(b, "t2", count=True, counted=refused.now) is None
    assert b.duplicates() == {}
    # A retry that is refused again counts nothing more: the call is one duplicate.
    refused = claim(b, "t3", count=True)
    assert refused is not None
    assert claim(b, "t3", count=True, counted=refused.now) is not None
    assert b.duplicates() == {"tests.Job": 1}
    # The same for a start.
    assert start(b, "t4", key="r") is None
    refused = start(b, "t5", key="r", count=True)
    assert refused is not None and b.duplicates() == {"tests.Job": 2}
    assert b.reclaim("r", None, "t4")
    assert start(b, "t5", key="r", count=True, counted=refused.now) is None
    assert b.duplicates() == {"tests.Job": 1}


def test_refused_calls_are_counted_by_kind(store: Store) -> None:
    b = store.backend
    assert b.drops() == {"duplicates": {}, "coalesced": {}, "replaced": {}}
    assert _coalesce(b, "t1", 1, "keep_last", count=True) is None
    for n in (2, 3):  # taken over by the queued call
        assert _coalesce(b, f"t{n}", n, "keep_last", count=True, debounce=(0.05, None)) is not None
    assert claim(b, "t4", count=True) is not None  # no coalescing asked: a dropped duplicate
    store.advance(0.1)  # due
    assert _start_own(b, "t1")[0] is None
    assert _coalesce(b, "t5", 5, "keep_last", count=True) is not None  # pending behind the run
    assert _coalesce(b, "t6", 6, "replace", count=True) is not None  # running: dropped as any duplicate
    assert b.claim("o", "t7", meta=_call(7), coalesce="replace") is None
    assert b.claim("o", "t8", meta=_call(8), coalesce="replace", count=True) is not None
    other = QueueMeta("tests.Other")  # a class of its own has keys of its own
    assert b.claim("p", "t9", meta=other, coalesce="replace") is None
    assert b.claim("p", "t10", meta=other, coalesce="replace", count=True) is not None
    assert b.drops() == {
        "duplicates": {"tests.Job": 2},
        "coalesced": {"tests.Job": 3},
        "replaced": {"tests.Job": 1, "tests.Other": 1},
    }
    assert b.duplicates() == {"tests.Job": 2}
    assert b.drops(60) == b.drops()


def test_a_coalesced_refusal_resolved_and_retaken_is_taken_back(store: Store) -> None:
    b = store.backend
    assert _coalesce(b, "t1", 1, "keep_last") is None
    assert _start_own(b, "t1")[0] is None
    refused = _coalesce(b, "t2", 2, "keep_last", count=True)
    assert refused is not None and refused.coalesced == "pending"
    assert b.drops()["coalesced"] == {"tests.Job": 1}
    assert b.reclaim("k", "t1", "t1")  # the caller proved the holder dead (its pending call goes too)
    assert _coalesce(b, "t2", 2, "keep_last", count=True, counted=refused.now) is None
    assert b.drops() == {"duplicates": {}, "coalesced": {}, "replaced": {}}


def test_duplicates_are_counted_over_a_window(backend: Backend) -> None:
    b = backend
    assert claim(b, "t1") is None
    for token in ("t2", "t3"):
        assert claim(b, token, count=True) is not None
    assert b.duplicates(60) == {"tests.Job": 2}  # this minute's bucket overlaps any window
    assert b.duplicates(0.5) == {"tests.Job": 2}
    for bad in (0, -1, 3601, float("nan"), "60", True):
        with pytest.raises(ConfigurationError, match="window of dropped duplicates"):
            b.duplicates(bad)  # type: ignore[arg-type]


def test_counts_age_out_of_the_window_by_the_minute(store: Store) -> None:
    b = store.backend
    if isinstance(b, RedisBackend):
        pytest.skip("Redis keeps the server's clock: its buckets' ageing is tested in tests/test_drops.py")
    assert claim(b, "t1") is None
    assert claim(b, "t2", count=True) is not None
    store.advance(120)
    assert claim(b, "t3", count=True) is not None
    assert b.duplicates(3600) == {"tests.Job": 2}
    assert b.duplicates(60) == {"tests.Job": 1}  # the older minute is outside the last one
    store.advance(3600)
    assert claim(b, "t4", count=True) is not None
    assert b.duplicates(3600) == {"tests.Job": 2}  # the first minute has left the hour
    store.advance(3700)
    assert b.duplicates(3600) == {}


def _damage(b: Backend, key: str) -> bool:
    """Give ``key``'s run lock a field of the wrong type in the store; False if it has no record to damage.

    (The memory and dict stores hold Python objects, never a record a
    reader could find torn.)
    """
    if isinstance(b, RedisBackend):
        assert b.client.hset(b._keys(key)[1], "i", "x") == 0  # the pid: there already
        return True
    if isinstance(b, FileBackend):
        for path in b.directory.glob("*.json"):
            record = json.loads(path.read_text())
            if record.get("key") == key:
                record["r"]["pid"] = "x"
                path.write_text(json.dumps(record))
                return True
        raise AssertionError(f"no record of {key!r} under {b.directory}")
    return False


def _facts(state: LockState | CorruptRecordError) -> tuple[object, ...]:
    """What a read found, less the times left (they run down between two reads)."""
    if isinstance(state, CorruptRecordError):
        return ("corrupt", state.path, state.key, state.reason)
    queue, run = state.queue, state.run
    return (
        state.key,
        state.free,
        None if queue is None else (queue.token, queue.state, queue.since, queue.meta, queue.ttl is None),
        None if run is None else (run.token, run.holder, run.started, run.lease, run.fence),
    )


def test_read_many_reads_each_key_as_read_does(store: Store) -> None:
    b = store.backend
    assert b.read_many([]) == []
    keys = [f"key:{i}" for i in range(5)]
    for i, key in enumerate(keys):
        meta = QueueMeta("tests.Job", f"({i},)", f"job-{i}")
        run = RunClaim(ME, 60.0) if i % 2 else None
        assert b.claim(key, f"t{i}", meta=meta, ttl=600 if i == 4 else None, run=run) is None
    assert b.claim("{brace}", "tb", meta=META) is None
    assert b.claim("damaged", "td", meta=META, run=RunClaim(ME, 60.0)) is None
    damaged = _damage(b, "damaged")
    asked = [keys[0], keys[1], "damaged", "free", keys[2], "{brace}", keys[3], keys[4]]
    many = b.read_many(asked)
    one: list[LockState | CorruptRecordError] = []
    for key in asked:
        try:
            one.append(b.read(key))
        except CorruptRecordError as exc:
            one.append(exc)
    assert [_facts(s) for s in many] == [_facts(s) for s in one]
    assert isinstance(many[2], CorruptRecordError) == damaged
    assert isinstance(many[3], LockState) and many[3].free
    assert all(isinstance(s, LockState) and not s.free for s in many[:2] + many[4:])


# -- `uniqjob run --overlap`: a pending run, a stop request (Backend.overlap) ------------------


def overlap(b: Backend, token: str, mode: str, lease: float = LEASE) -> str:
    return b.overlap("k", token, mode, lease=lease, holder=OTHER)  # type: ignore[arg-type]


def test_buffer_records_one_pending_run_until_it_holds_the_key(store: Store) -> None:
    b = store.backend
    assert overlap(b, "b", "buffer") == "free" and b.read("k").pending_run == ""  # nothing to wait for
    assert b.claim("k", "a", meta=META, run=RunClaim(ME, 10)) is None
    assert overlap(b, "b", "buffer", lease=10) == "pending"
    assert b.read("k").pending_run == "host-b:4242"
    assert overlap(b, "c", "buffer") == "coalesced"  # into b's run
    assert overlap(b, "b", "buffer", lease=10) == "pending"  # b's own, refreshed
    b.finish("k", "a")
    assert overlap(b, "d", "buffer") == "coalesced"  # the key is free, but b is first in line
    assert overlap(b, "b", "buffer") == "free"
    assert b.claim("k", "b", meta=META, run=RunClaim(OTHER, 10)) is None
    assert b.read("k").pending_run == ""  # b runs: no longer pending
    assert overlap(b, "e", "buffer") == "pending"  # the next run waits behind b
    assert overlap(b, "e", "withdraw") == "free"  # ... and gives up
    assert overlap(b, "f", "buffer", lease=10) == "pending"


def test_a_pending_run_that_took_the_key_withdraws_so_the_next_is_not_coalesced(store: Store) -> None:
    b = store.backend
    assert b.claim("k", "a", meta=META, run=RunClaim(ME, 10)) is None
    assert overlap(b, "b", "buffer", lease=10) == "pending"
    b.finish("k", "a")
    assert overlap(b, "b", "buffer") == "free"
    assert b.claim("k", "b", meta=META, run=RunClaim(OTHER, 10)) is None
    assert overlap(b, "c", "withdraw") == "free" and overlap(b, "b", "withdraw") == "free"
    b.finish("k", "b")
    assert overlap(b, "d", "buffer") == "free"  # b ran and ended: nothing waits, nothing runs


def test_a_pending_run_lapses_with_its_lease(store: Store) -> None:
    b = store.backend
    assert b.claim("k", "a", meta=META, run=RunClaim(ME, 10)) is None
    assert overlap(b, "b", "buffer") == "pending"
    store.advance(LEASE + 0.1)  # b stopped asking: its place goes
    assert b.read("k").pending_run == ""
    assert overlap(b, "c", "buffer", lease=10) == "pending"


def test_terminate_asks_the_holder_to_stop_and_its_renewal_says_so(store: Store) -> None:
    b = store.backend
    assert overlap(b, "t", "terminate") == "free"
    assert b.claim("k", "a", meta=META, run=RunClaim(ME, 10)) is None
    assert b.renew("k", "a", 10)
    assert overlap(b, "t", "terminate") == "stopping"
    state = b.read("k")
    assert state.run is not None and state.run.token == "a" and state.run.stop == "host-b:4242"
    assert not b.renew("k", "a", 10)  # its holder learns it, and the lease is not extended
    assert b.read("k").run is not None  # still held, until its holder ends or its lease lapses
    b.finish("k", "a")
    assert b.read("k").free and overlap(b, "t", "terminate") == "free"
    assert claim(b, "queued") is None
    assert overlap(b, "t", "terminate") == "busy"  # a queued job: no run to stop


def test_a_stop_request_ends_with_its_run_lock(store: Store) -> None:
    b = store.backend
    assert b.claim("k", "a", meta=META, run=RunClaim(ME, LEASE)) is None
    assert overlap(b, "t", "terminate") == "stopping"
    store.advance(LEASE + 0.1)  # the holder never ended: its lease lapses where it was
    assert overlap(b, "t", "terminate") == "free"
    assert b.claim("k", "t", meta=META, run=RunClaim(OTHER, 10)) is None
    state = b.read("k")
    assert state.run is not None and state.run.token == "t" and state.run.stop == ""
    assert b.renew("k", "t", 10)


# -- coalescing (Backend.claim's coalesce, start's "own", finish's pending call) ----------------


def _call(n: int) -> QueueMeta:
    """The meta of call ``n`` of tests.Job: its preview, job id and arguments."""
    return QueueMeta("tests.Job", f"({n},)", f"job-{n}", json.dumps({"a": [n]}))


def _coalesce(b: Backend, token: str, n: int, how: str, **kw: object) -> LockState | None:
    return b.claim("k", token, meta=_call(n), coalesce=how, **kw)  # type: ignore[arg-type]


def _start_own(b: Backend, token: str, holder: Holder = ME) -> tuple[LockState | None, RunClaim]:
    run = RunClaim(holder, LEASE)
    return b.start("k", token, run=run, meta=META, queue_lock="own"), run


def test_keep_last_while_queued_hands_the_latest_arguments_to_the_start(store: Store) -> None:
    b = store.backend
    assert _coalesce(b, "t1", 1, "keep_last") is None
    for n in (2, 3):
        state = _coalesce(b, f"t{n}", n, "keep_last")
        assert state is not None and state.coalesced == "latest"
        assert state.queue is not None and state.queue.token == "t1" and state.queue.meta.job_id == "job-1"
    queue = b.read("k").queue
    assert queue is not None and queue.token == "t1" and queue.meta == replace(_call(3), job_id="job-1")
    refused, run = _start_own(b, "t2")  # a coalesced call's token holds nothing
    assert refused is not None and run.call == ""
    granted, run = _start_own(b, "t1")
    assert granted is None and run.call == _call(3).call and run.fence > 0
    assert b.finish("k", "t1") is None
    assert b.read("k").free


def test_keep_last_while_running_keeps_one_pending_call_queued_by_finish(store: Store) -> None:
    b = store.backend
    assert _coalesce(b, "t1", 1, "keep_last") is None
    assert _start_own(b, "t1")[0] is None
    for n in (2, 3, 4):
        state = _coalesce(b, f"t{n}", n, "keep_last", count=True)
        assert state is not None and state.coalesced == "pending" and state.queue is not None
        assert state.queue.state == "running"
    queue = b.read("k").queue
    assert queue is not None and queue.pending is not None
    assert queue.pending.token == "t4" and queue.pending.meta == replace(_call(4), cls="")
    assert b.duplicates() == {}  # a coalesced call is no dropped duplicate: it is counted as coalesced
    assert b.drops() == {"duplicates": {}, "coalesced": {"tests.Job": 3}, "replaced": {}}
    pending = b.finish("k", "t1")  # a token of its own, which an undo of t4's claim leaves alone
    assert pending is not None and pending.token == "t4+" and pending.meta.call == _call(4).call
    assert pending.meta.job_id == "job-4"
    state = b.read("k")
    assert state.run is None and state.queue is not None and state.queue.state == "queued"
    assert state.queue.token == "t4+" and state.queue.meta == _call(4)  # its arguments kept...
    assert state.queue.pending is None
    again = b.finish("k", "t1")  # ...so that a retry after a lost reply gets the same call again
    assert again is not None and (again.token, again.meta) == (pending.token, pending.meta)
    assert not b.reclaim("k", "t4", "t4")  # the undo of t4's claim, had its reply been lost
    granted, run = _start_own(b, "t4+")  # its caller pushed the job with the pending call's arguments
    assert granted is None and run.call == _call(4).call
    assert b.finish("k", "t1") is None  # no longer waiting: the retry of a finish long done
    assert b.finish("k", "t4+") is None
    assert b.read("k").free


def test_keep_last_while_queued_drops_a_pending_call(store: Store) -> None:
    b = store.backend
    assert _coalesce(b, "t1", 1, "keep_last") is None
    assert _start_own(b, "t1")[0] is None
    assert _coalesce(b, "t2", 2, "keep_last") is not None  # pending
    assert b.requeue("k", "t1", meta=_call(1), ttl=None)  # t1 waits for a retry: queued again
    state = _coalesce(b, "t3", 3, "keep_last")
    assert state is not None and state.coalesced == "latest"
    queue = b.read("k").queue
    assert queue is not None and queue.pending is None and queue.meta.call == _call(3).call
    assert b.finish("k", "t1") is None  # the retry runs with the latest arguments: nothing after it


def test_an_orphan_with_a_pending_call_goes_to_the_next_claim(store: Store) -> None:
    b = store.backend
    assert _coalesce(b, "t1", 1, "keep_last") is None
    assert _start_own(b, "t1", OTHER)[0] is None
    assert _coalesce(b, "t2", 2, "keep_last") is not None
    store.advance(LEASE * 1.5)  # the holder stopped beating: its record is an orphan
    assert _coalesce(b, "t3", 3, "keep_last") is None  # the latest call takes the key
    queue = b.read("k").queue
    assert queue is not None and queue.token == "t3" and queue.pending is None
    assert queue.meta == replace(_call(3), call="")  # a fresh lock: its job carries the arguments


def test_replace_moves_a_queued_lock_to_the_new_job_and_refuses_the_old_start(store: Store) -> None:
    b = store.backend
    assert _coalesce(b, "t1", 1, "replace") is None
    state = _coalesce(b, "t2", 2, "replace", count=True)
    assert state is not None and state.coalesced == "replaced"
    assert state.queue is not None and state.queue.token == "t1" and state.queue.meta.job_id == "job-1"
    queue = b.read("k").queue
    assert queue is not None and queue.token == "t2" and queue.meta.job_id == "job-2"
    assert b.drops() == {"duplicates": {}, "coalesced": {}, "replaced": {"tests.Job": 1}}
    refused, _ = _start_own(b, "t1")  # the replaced job, dequeued by a worker all the same
    assert refused is not None and b.read("k").run is None
    assert _start_own(b, "t2")[0] is None
    state = _coalesce(b, "t3", 3, "replace")  # running: refused as any duplicate
    assert state is not None and state.coalesced == ""
    b.finish("k", "t2")
    assert b.read("k").free
    assert _start_own(b, "t1")[0] is not None  # nor later, once the key is free


def test_a_start_that_owns_its_queue_lock_takes_it_as_run_does(store: Store) -> None:
    b = store.backend
    assert claim(b, "t1") is None
    assert _start_own(b, "t1")[0] is None
    state = b.read("k")
    assert state.queue is not None and state.queue.state == "running" and state.run is not None
    assert _start_own(b, "t1")[0] is None  # a re-take, after a lost reply
    b.finish("k", "t1")
    assert b.read("k").free


def test_debounce_is_due_after_the_last_call_and_never_past_the_longest_wait(store: Store) -> None:
    b = store.backend
    slow = (60.0, None)
    assert _coalesce(b, "t1", 1, "keep_last", debounce=slow) is None
    first = b.read("k").queue
    assert first is not None and first.due == pytest.approx(first.since + 60, abs=1e-3)
    refused, _ = _start_own(b, "t1")  # not yet due: its job is delayed again
    assert refused is not None and refused.queue is not None and refused.queue.due is not None
    assert refused.queue.due > refused.now and b.read("k").run is None
    store.advance(0.05)
    state = _coalesce(b, "t2", 2, "keep_last", debounce=slow)
    assert state is not None and state.coalesced == "latest" and state.queue is not None
    pushed = b.read("k").queue
    assert pushed is not None and pushed.due is not None and pushed.due > (first.due or 0)  # pushed back
    assert state.queue.due == pytest.approx(pushed.due) and state.queue.meta.args == "(2,)"  # as it left it
    assert state.queue.ttl is None and state.queue.since == pytest.approx(first.since) and state.run is None
    state = _coalesce(b, "t3", 3, "keep_last", debounce=(60.0, 0.1))
    capped = b.read("k").queue
    assert capped is not None and capped.due == pytest.approx(capped.since + 0.1, abs=1e-3)
    store.advance(0.15)
    granted, run = _start_own(b, "t1")
    assert granted is None and run.call == _call(3).call
    b.finish("k", "t1")
    assert b.read("k").free
