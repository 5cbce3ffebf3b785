"""The backend contract: every store keeps it, so policy can live once above them.

Each test runs against Redis, the file store and memory. Time moves through
``Store.advance``: the file and memory stores take an injected clock; Redis
keeps the server's clock, so there leases are short and the test waits them out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import FakeClock
from uniqjob.backends.base import Backend
from uniqjob.backends.file import FileBackend
from uniqjob.backends.memory import MemoryBackend
from uniqjob.backends.redis import RedisBackend
from uniqjob.locks import Holder, LockState, QueueMeta, RunClaim

ME = Holder("host-a", "node-a", os.getpid(), 1)
OTHER = Holder("host-b", "node-b", 4242, 7)
META = QueueMeta("tests.Job", "(1,)", "job-1")
LEASE = 0.25  # short enough that Redis tests can wait one out


@dataclass
class Store:
    backend: Backend
    advance: Callable[[float], None]


@pytest.fixture(params=["redis", "file", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "redis":
        backend: RedisBackend = request.getfixturevalue("redis_backend")
        return Store(backend, time.sleep)
    clock = FakeClock()
    if request.param == "file":
        return Store(FileBackend(tmp_path / "locks", clock=clock), clock.advance)
    return Store(MemoryBackend(clock=clock), clock.advance)


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


def test_a_conflict_is_quiet_only_when_nothing_may_be_reclaimed(store: Store) -> None:
    b = store.backend
    plain = QueueMeta("tests.Job", "(1,)")
    assert b.claim("q", "t1", meta=plain) is None
    quiet = b.claim("q", "t2", meta=plain)
    assert quiet is not None and quiet.quiet and quiet.queue is not None and quiet.queue.token == "t1"
    assert b.attach("q", "t1", "job-9")  # now a queue may prove its job gone
    named = b.claim("q", "t3", meta=plain)
    assert named is not None and not named.quiet
    assert start(b, "t4", key="r") is None  # running
    running = b.claim("r", "t5", meta=plain)
    assert running is not None and not running.quiet


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
    assert start(b, "t1", queue="release") is None  # until_and_while: no queue lock while running
    assert b.requeue("k", "t1", meta=META, ttl=None)
    state = b.read("k")
    assert state.queue is not None and state.queue.token == "t1" and state.queue.state == "queued"
    b.finish("k", "t1")
    assert claim(b, "t2") is None
    assert start(b, "t1", queue="keep") is None
    assert not b.requeue("k", "t1", meta=META, ttl=None)  # t2's queued lock is left alone
    state = b.read("k")
    assert state.run is None and state.queue is not None and state.queue.token == "t2"
