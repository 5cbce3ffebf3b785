"""The batched reads (``read_many``) on Redis: each transport, a lost script cache, a cluster, paging, faults.

The contract suites (tests/test_backend_contract.py, tests/test_concurrency_store.py)
hold every store's ``read_many`` to ``[read(k) for k in keys]``; these test the
ways the Redis stores send a batch, and how the listings page the scan through it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Sequence

import pytest
import redis
from redis.cluster import RedisCluster

from uniqjob import ops
from uniqjob.concurrency import Park, SemaphoreState, SemaphoreStore, store_for
from uniqjob.errors import BackendError, CorruptRecordError
from uniqjob.locks import Holder, LockState, QueueMeta, RunClaim
from uniqjob.ops._pages import PAGE
from uniqjob.stores.memory import MemoryBackend
from uniqjob.stores.redis import RedisBackend

ME = Holder("host-a", "node-a", os.getpid(), 1)
COUNT = PAGE * 2 + 7  # three pages, the last one short


def fill(backend: RedisBackend, count: int = COUNT) -> list[str]:
    keys = [f"job:{n}" for n in range(count)]
    for n, key in enumerate(keys):
        run = RunClaim(ME, 60.0) if n % 3 == 0 else None
        assert backend.claim(key, f"t{n}", meta=QueueMeta("app.Job", str(n), f"id-{n}"), run=run) is None
    return keys


def tokens(states: Sequence[LockState | CorruptRecordError]) -> list[str | None]:
    return [s.queue.token if isinstance(s, LockState) and s.queue else None for s in states]


@pytest.fixture(params=["default pool", "blocking pool"])
def backend(request: pytest.FixtureRequest, redis_client: redis.Redis) -> Iterator[RedisBackend]:
    """A backend on redis-py's default pool and on a blocking one: the batch goes through the pipeline."""
    if request.param == "default pool":
        client = redis_client
    else:
        client = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(_url(redis_client)))
    made = RedisBackend(client, namespace=f"rm-{request.param[0]}")
    yield made
    made.close()


def _url(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/0"


def test_read_many_reads_a_batch_in_order(backend: RedisBackend) -> None:
    keys = fill(backend, 40)
    states = backend.read_many([*keys[:20], "free", *keys[20:]])
    assert tokens(states) == [f"t{n}" for n in range(20)] + [None] + [f"t{n}" for n in range(20, 40)]
    assert isinstance(states[20], LockState) and states[20].free


def test_read_many_reloads_a_script_the_server_lost(backend: RedisBackend, redis_client: redis.Redis) -> None:
    keys = fill(backend, 10)
    assert tokens(backend.read_many(keys)) == [f"t{n}" for n in range(10)]
    redis_client.script_flush()  # a restart, or an operator's SCRIPT FLUSH
    assert tokens(backend.read_many(keys)) == [f"t{n}" for n in range(10)]
    store = store_for(backend)
    take(store, "c0")
    redis_client.script_flush()
    (state,) = store.read_many(["c0"])
    assert isinstance(state, SemaphoreState) and [s.token for s in state.slots] == ["a"]


def take(store: SemaphoreStore, key: str) -> None:
    out = store.acquire(
        key, "a", limit=1, lease=60.0, running=False, holder=None, park=Park("queue", "{}"),
        job_class="app.Limited", args="", caller=ME,
    )  # fmt: skip
    assert out.status == "taken"


def _untimed(row: ops.LockRow) -> tuple[object, ...]:
    """A row less its times (they run down between two reads)."""
    return (row.key, row.job_class, row.args, row.state, row.job_id, row.host, row.pid, row.orphaned)


def test_the_listing_reads_page_by_page_as_each_key_alone(backend: RedisBackend) -> None:
    keys = fill(backend)
    torn = keys[PAGE + 1]  # one with a run lock
    assert backend.client.hset(backend._keys(torn)[1], "i", "x") == 0  # damaged: its pid is not a number
    rows = {row.key: row for row in ops.iter_rows(backend)}
    assert len(rows) == COUNT
    assert rows[torn].state == ops.CORRUPT and rows[torn].path == backend._keys(torn)[1]
    for key in keys:
        if key != torn:
            assert _untimed(rows[key]) == _untimed(ops.LockRow.from_state(backend.read(key)))
    assert ops.stats(backend).running == len(range(0, COUNT, 3)) - 1  # the torn one's run lock is unreadable


def test_the_concurrency_figures_read_page_by_page(backend: RedisBackend) -> None:
    store = store_for(backend)
    for n in range(PAGE + 5):
        take(store, f"c{n}")
    totals = ops.concurrency(backend, top=3).totals
    assert (totals.keys, totals.slots_held, totals.keys_at_limit) == (PAGE + 5,) * 3


def test_a_cluster_batch_goes_to_every_primary(redis_cluster_client: RedisCluster) -> None:
    backend = RedisBackend(redis_cluster_client, namespace="rm-cluster")
    keys = fill(backend, 60)
    node_of = redis_cluster_client.get_node_from_key
    nodes = {node_of(backend._keys(key)[0]).name for key in keys}  # type: ignore[no-untyped-call, unused-ignore]
    primaries = redis_cluster_client.get_primaries()  # type: ignore[no-untyped-call, unused-ignore]
    assert len(nodes) == len(primaries) > 1  # the batch spans them all
    assert tokens(backend.read_many(["free", *keys])) == [None] + [f"t{n}" for n in range(60)]
    store = store_for(backend)
    for n in range(20):
        take(store, f"c{n}")
    states = store.read_many([f"c{n}" for n in range(20)], head=1)
    assert [s.key if isinstance(s, SemaphoreState) else s for s in states] == [f"c{n}" for n in range(20)]
    assert len(list(ops.iter_rows(backend))) == 60


def test_a_read_of_a_subclass_own_is_used_key_by_key(redis_client: redis.Redis) -> None:
    asked: list[str] = []

    class Audited(RedisBackend):
        def read(self, key: str) -> LockState:
            asked.append(key)
            return super().read(key)

    backend = Audited(redis_client, namespace="rm-audited")
    keys = fill(backend, 3)
    assert tokens(backend.read_many(keys)) == ["t0", "t1", "t2"] and asked == keys


class Miscounting(MemoryBackend):
    """A store of the user's whose read_many loses a key."""

    def read_many(self, keys: Sequence[str]) -> list[LockState | CorruptRecordError]:
        return super().read_many(keys)[1:]


def test_a_read_many_that_loses_a_key_is_a_backend_error() -> None:
    backend = Miscounting()
    assert backend.claim("k", "t", meta=QueueMeta("app.Job")) is None
    with pytest.raises(BackendError, match=r"Miscounting.read_many returned 0 states for 1 keys"):
        list(ops.iter_rows(backend))


def test_a_server_that_is_down_fails_the_batch_with_a_backend_error() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = RedisBackend(f"redis://127.0.0.1:{port}", timeout=0.5)
    with pytest.raises(BackendError, match="redis"):
        backend.read_many(["a", "b"])
    with pytest.raises(BackendError, match="redis"):
        store_for(backend).read_many(["a"])


def test_a_record_of_the_wrong_type_is_its_keys_error_in_the_batch(backend: RedisBackend) -> None:
    keys = fill(backend, 3)
    backend.client.set(backend._keys("torn")[0], "garbage")  # a string where a queue lock (a hash) belongs
    store = store_for(backend)
    take(store, "c0")
    take(store, "c1")
    semaphores = store._keys("c0")  # type: ignore[attr-defined]
    backend.client.delete(semaphores[1])
    backend.client.set(semaphores[1], "garbage")  # a string where the parked list belongs
    states = backend.read_many([keys[0], "torn", keys[1], keys[2]])
    assert tokens(states) == ["t0", None, "t1", "t2"]
    with pytest.raises(CorruptRecordError) as alone:
        backend.read("torn")
    torn = states[1]
    assert isinstance(torn, CorruptRecordError) and (torn.path, torn.reason) == (
        alone.value.path,
        alone.value.reason,
    )
    slots = store.read_many(["c1", "c0"])
    with pytest.raises(CorruptRecordError) as one:
        store.read("c0")
    assert isinstance(slots[0], SemaphoreState) and isinstance(slots[1], CorruptRecordError)
    assert (slots[1].path, slots[1].reason) == (one.value.path, one.value.reason)
    assert slots[1].path == semaphores[1] and "list" in slots[1].reason  # named by the structure at fault
