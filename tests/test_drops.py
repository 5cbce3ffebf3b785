"""Dropped duplicates as a user meets them: every policy's duplicate counted once, per class, in the store.

The counting itself (what a store counts, the window, taking a count back)
is the contract's: tests/test_backend_contract.py. Here: what the job layer
asks the store to count, across processes, and how Redis keeps the counts.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
from redis.crc import key_slot

import uniqjob
from tests.conftest import FakeClock
from tests.redis_server import RedisServer
from tests.support.topologies import Cluster
from uniqjob import CorruptRecordError, JobLock, JobNotUnique, Queue, UniqueJob, stores
from uniqjob.locks import Holder, QueueMeta, RunClaim, local_holder
from uniqjob.ops import duplicates
from uniqjob.stores._droplog import COMPACT
from uniqjob.stores.base import Backend
from uniqjob.stores.file import FileBackend
from uniqjob.stores.redis import RedisBackend


@pytest.fixture
def use(backend: Backend) -> Backend:
    uniqjob.configure(backend)
    return backend


class Export(UniqueJob):
    """Runs inline; a call while one runs is a duplicate, dropped and logged."""

    inner: ClassVar[list[Any]] = []

    def perform(self, n: int) -> None:
        Export.inner.append(Export.enqueue(n))


class Strict(UniqueJob):
    unique_on_conflict = "raise"

    def perform(self, n: int) -> None:
        with pytest.raises(JobNotUnique):
            Strict.enqueue(n)


class Later(UniqueJob):
    unique_on_conflict = "reschedule"
    unique_reschedule_delay = 0.0

    def perform(self, n: int) -> None:
        pass


class Pushed(Queue):
    """A queue that keeps the jobs pushed and the calls rescheduled."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Any, ...]] = []
        self.later: list[tuple[Any, ...]] = []

    def push(
        self, job_cls: type[UniqueJob], lock: JobLock, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        self.jobs.append(args)
        return len(self.jobs)

    def push_later(
        self, job_cls: type[UniqueJob], args: tuple[Any, ...], kwargs: dict[str, Any], delay: float
    ) -> Any:
        self.later.append(args)


def test_each_policys_duplicate_is_counted_once_under_its_class(use: Backend) -> None:
    Export.inner.clear()
    Export.enqueue(1)
    Export.enqueue(2)
    assert Export.inner == [None, None]  # each call's duplicate, dropped
    Strict.enqueue(1)

    queue = Pushed()

    class Queued(Later):
        unique_queue = queue

    assert Queued.enqueue(7) == 1
    assert Queued.enqueue(7) is None and Queued.enqueue(7) is None  # rescheduled, twice
    assert queue.later == [(7,), (7,)]
    assert duplicates(use) == {Queued.job_name(): 2, Export.job_name(): 2, Strict.job_name(): 1}
    assert duplicates() == duplicates(use)  # the configured store by default


def test_a_free_key_and_a_reclaimed_orphan_are_not_duplicates(use: Backend) -> None:
    Export.inner.clear()
    key = Export.lock_key(3)
    # A crashed holder on this host: its run lock names a pid that is gone, its queue lock says running.
    me = local_holder()
    dead = Holder(me.host, me.node, _dead_pid(), 1)
    assert use.claim(key, "crashed", meta=QueueMeta(Export.job_name()), run=RunClaim(dead, 60.0)) is None
    Export.enqueue(3)  # reclaims the orphan and runs; the call inside it is the one duplicate
    assert Export.inner == [None]
    assert duplicates(use) == {Export.job_name(): 1}


def test_a_key_with_a_free_slot_is_no_duplicate(use: Backend) -> None:
    class Pair(UniqueJob):
        unique_lock_limit = 2
        unique_queue = Pushed()

        def perform(self, n: int) -> None:
            pass

    assert Pair.enqueue(1) and Pair.enqueue(1)  # the second takes the second slot
    assert duplicates(use) == {}
    assert Pair.enqueue(1) is None  # both held: now it is one
    assert duplicates(use) == {Pair.job_name(): 1}


def test_a_second_delivery_is_skipped_not_counted(use: Backend) -> None:
    class Once(UniqueJob):
        unique_strategy = "while_executing"

        def perform(self, n: int) -> None:
            # the broker hands the very same job to another worker meanwhile
            again = Once.lock_from(lock.key, lock.token)
            assert Once.execute(again, (n,), {}) is None

    lock = Once.lock(1)
    assert Once.execute(lock, (1,), {}) is None
    assert duplicates(use) == {}


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _enqueue_twice(url: str, n: int) -> None:
    uniqjob.configure(url)
    Export.enqueue(n)  # and, inside perform, once more: a duplicate


@pytest.mark.parametrize("kind", ["redis", "file"])
@pytest.mark.slow
def test_every_processs_drops_are_counted_in_one_place(
    kind: str, redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    url = redis_server.url if kind == "redis" else (tmp_path / "locks").as_uri()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_enqueue_twice, args=(url, n)) for n in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert duplicates(stores.from_url(url)) == {Export.job_name(): 3}


# -- how Redis keeps them ---------------------------------------------------------------------


def test_redis_counts_share_the_lock_keys_slot(redis_backend: RedisBackend) -> None:
    b = redis_backend
    key = "tests.Job:1:{odd}key"
    assert b.claim(key, "t1", meta=QueueMeta("tests.Job")) is None
    assert b.claim(key, "t2", meta=QueueMeta("tests.Job"), count=True) is not None
    names = [n.decode() for n in b.client.scan_iter(match=f"{b.namespace}:*")]
    (drops,) = [n for n in names if n.endswith(":d")]
    assert {key_slot(n.encode()) for n in names} == {key_slot(b._keys(key)[0].encode())}
    fields = b.client.hgetall(drops)
    assert fields[b"n"] == b"9"  # the class is the key's first 9 characters, kept as its length
    ttl = b.client.pttl(drops)
    assert 3_600_000 < ttl <= 3_660_000  # an hour and a bucket
    assert b.duplicates() == {"tests.Job": 1}


def test_redis_drops_minutes_past_the_hour_and_reads_only_the_window(redis_backend: RedisBackend) -> None:
    b = redis_backend
    meta = QueueMeta("other.Class")
    assert b.claim("k", "t1", meta=meta) is None
    assert b.claim("k", "t2", meta=meta, count=True) is not None
    (drops,) = [n for n in b.client.scan_iter(match=f"{b.namespace}:*:d")]
    now = int(b.client.time()[0]) // 60
    # Counts of earlier minutes, as if this key had drops all along: one in the hour, one past it.
    # Each kind of call has its own buckets: coalesced ("<minute>c") and replaced ("<minute>r").
    b.client.hset(drops, mapping={str(now - 30): 5, str(now - 62): 7, f"{now - 30}c": 2, f"{now - 62}r": 4})
    assert b.duplicates() == {"other.Class": 6}
    assert b.drops() == {"duplicates": {"other.Class": 6}, "coalesced": {"other.Class": 2}, "replaced": {}}
    assert b.duplicates(60) == {"other.Class": 1}
    # The next new minute prunes what is past keeping; simulate it by emptying this minute's bucket.
    b.client.hdel(drops, str(now))
    assert b.claim("k", "t3", meta=meta, count=True) is not None
    kept = {"c", str(now - 30), f"{now - 30}c", str(now)}
    assert set(b.client.hkeys(drops)) == {f.encode() for f in kept}
    assert b.duplicates() == {"other.Class": 6}


def test_a_damaged_redis_counter_never_blocks_a_lock(
    redis_backend: RedisBackend, caplog: pytest.LogCaptureFixture
) -> None:
    b = redis_backend
    meta = QueueMeta("tests.Job")
    b.client.set(f"{b.namespace}:{{k}}:d", "not a hash")
    assert b.claim("k", "t1", meta=meta) is None
    assert b.claim("k", "t2", meta=meta, count=True) is not None  # refused as ever, uncounted
    assert b.duplicates() == {}
    assert "not a hash of dropped duplicates" in caplog.text


def test_a_damaged_file_counter_line_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    b = FileBackend(tmp_path / "locks")
    meta = QueueMeta("tests.Job")
    assert b.claim("k", "t1", meta=meta) is None
    assert b.claim("k", "t2", meta=meta, count=True) is not None
    (counts,) = list((tmp_path / "locks").glob(".*.drops"))
    assert os.stat(counts).st_mode & 0o777 == 0o600
    with counts.open("a") as f:
        f.write('\n[29000000, 1, "tests.Jo')  # an append cut short by a crash
    assert b.claim("k", "t3", meta=meta, count=True) is not None
    assert b.duplicates() == {"tests.Job": 2}
    assert "skipped 1 unreadable line(s) of dropped-duplicate counts" in caplog.text


def test_a_file_counter_that_is_no_regular_file_never_blocks_a_lock(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    b = FileBackend(tmp_path / "locks")
    meta = QueueMeta("tests.Job")
    assert b.claim("k", "t1", meta=meta) is None
    (counts,) = [p for p in (tmp_path / "locks").iterdir() if p.suffix == ".json"]
    stripe = int(counts.name[:2], 16) % 64
    drops = tmp_path / "locks" / f".{stripe:02d}.drops"
    drops.symlink_to(tmp_path / "elsewhere")
    assert b.claim("k", "t2", meta=meta, count=True) is not None  # refused as ever, uncounted
    assert b.duplicates() == {}
    assert "not counting a duplicate" in caplog.text and not (tmp_path / "elsewhere").exists()


def test_a_long_file_counter_log_is_compacted(tmp_path: Path, clock: FakeClock) -> None:
    b = FileBackend(tmp_path / "locks", clock=clock)
    meta = QueueMeta("tests.Job")
    assert b.claim("k", "t1", meta=meta) is None
    refusals = 0
    for _ in range(3):
        for _ in range(300):
            assert b.claim("k", "t2", meta=meta, count=True) is not None
            refusals += 1
        clock.advance(60)
    (log,) = list((tmp_path / "locks").glob(".*.drops"))
    assert log.stat().st_size <= COMPACT  # rewritten as it grew: one line per class and minute
    assert b.duplicates() == {"tests.Job": refusals}
    clock.advance(3700)
    assert b.duplicates() == {}


def test_a_file_counter_log_keeps_each_kind_through_compaction(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    b = FileBackend(tmp_path / "locks", clock=clock)
    meta = QueueMeta("tests.Job", call='{"a":[],"k":{}}')
    assert b.claim("k", "t1", meta=meta) is None
    for _ in range(200):
        assert b.claim("k", "t2", meta=meta, count=True) is not None
        assert b.claim("k", "t3", meta=meta, count=True, coalesce="keep_last") is not None
    (log,) = list((tmp_path / "locks").glob(".*.drops"))
    assert log.stat().st_size <= COMPACT  # compacted at least once: one line per class, minute and kind
    minute = int(clock() // 60)
    with log.open("a") as f:  # a line written before kinds were counted reads as a dropped duplicate,
        f.write(f'\n[{minute}, 1, "tests.Job"]\n[{minute}, 1, "tests.Job", "x"]')  # an unknown kind skipped
    assert b.drops() == {"duplicates": {"tests.Job": 201}, "coalesced": {"tests.Job": 200}, "replaced": {}}
    assert "skipped 1 unreadable line(s)" in caplog.text


@pytest.mark.slow
def test_counts_in_a_redis_cluster_are_kept_beside_each_lock_and_summed_over_every_node() -> None:
    with Cluster(masters=3, replicas=0) as cluster:
        client = redis.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
        b = RedisBackend(client, namespace="c")
        meta = QueueMeta("app.Job")
        keys = [f"app.Job:{i}" for i in range(30)]
        for key in keys:
            assert b.claim(key, "t1", meta=meta) is None
            assert b.claim(key, "t2", meta=meta, count=True) is not None  # one script: one slot
        nodes = {client.get_node_from_key(f"c:{{{key}}}:d").name for key in keys}  # type: ignore[no-untyped-call, unused-ignore]
        assert len(nodes) == 3  # the counts are spread over every master
        assert b.duplicates() == {"app.Job": 30}
        client.close()


def test_a_refusal_that_finds_a_damaged_record_is_not_counted(redis_backend: RedisBackend) -> None:
    b = redis_backend
    meta = QueueMeta("tests.Job")
    assert b.start("k", "t1", run=RunClaim(local_holder(), 60.0), meta=meta, queue_lock="keep") is None
    b.client.set(f"{b.namespace}:{{k}}:q", "not a hash")  # what the refusal's snapshot reads
    with pytest.raises(CorruptRecordError, match="a Redis string where a hash belongs"):
        b.start("k", "t2", run=RunClaim(local_holder(), 60.0), meta=meta, queue_lock="keep", count=True)
    assert b.duplicates() == {}
