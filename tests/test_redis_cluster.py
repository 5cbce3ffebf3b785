"""The Redis stores on a real Redis Cluster (3 masters, 3 replicas): every key, every node, every error.

The contract suites run on the cluster too (``cluster`` in tests/conftest.py's
STORES); these are the cases only a cluster has: keys spread over primaries,
hash tags, a reshard, scripts flushed on every node, a client of valkey-py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.cluster import RedisCluster
from redis.crc import key_slot

from tests.conftest import cluster_client
from tests.redis_server import RedisServer
from tests.support.topologies import Cluster, _client, _cmd
from uniqjob import BackendError, ops
from uniqjob.concurrency import store_for, sweep
from uniqjob.locks import QueueMeta, RunClaim, local_holder
from uniqjob.stores.aio import async_backend
from uniqjob.stores.redis import RedisBackend
from uniqjob.stores.redis._async import RedisAsync
from uniqjob.stores.redis._client import key_of, names
from uniqjob.stores.redis._semaphores import RedisSemaphores
from uniqjob.stores.semaphores import SemaphoreStore

#: Keys a user can make whose characters are hash-tag syntax, or not ASCII.
ODD_KEYS = ["}", "}x", "}{", "{}", "{", "a{b}c", "{a}b", "}}{{", "x}", "", "ключ:{é}", "\U0001f512}{z"]


@pytest.fixture
def cluster(redis_cluster_client: RedisCluster, redis_cluster: Cluster) -> Cluster:
    return redis_cluster


@pytest.fixture
def backend(redis_cluster_client: RedisCluster) -> Iterator[RedisBackend]:
    store = RedisBackend(redis_cluster_client, namespace="c")
    yield store
    store.close()


def _slot(cluster: Cluster, name: str) -> int:
    with _client(cluster.live()[0]) as client:
        return int(_cmd(client, "CLUSTER", "KEYSLOT", name))


def _take(backend: RedisBackend, key: str) -> None:
    """A queue lock and a run lock of ``key``: a script that touches all three of its Redis keys."""
    run = RunClaim(local_holder(), 30)
    assert backend.claim(key, "t-" + key, meta=QueueMeta("C", "a"), run=run) is None
    assert run.fence >= 1


def test_repr_names_the_cluster_s_nodes(backend: RedisBackend, cluster: Cluster) -> None:
    shown = repr(backend)
    assert shown.startswith("RedisBackend(cluster [127.0.0.1:")
    assert any(f"127.0.0.1:{port}" in shown for port in cluster.ports)
    assert "None" not in shown
    semaphores = repr(backend.semaphores())
    assert semaphores.startswith("RedisSemaphores(cluster [127.0.0.1:") and "None" not in semaphores


@pytest.mark.parametrize("key", ODD_KEYS)
def test_every_key_keeps_its_redis_keys_in_one_slot(
    backend: RedisBackend, cluster: Cluster, key: str
) -> None:
    assert len({_slot(cluster, name) for name in backend._keys(key)}) == 1
    semaphores = backend.semaphores()
    assert isinstance(semaphores, RedisSemaphores)
    assert len({_slot(cluster, name) for name in semaphores._keys(key)}) == 1
    _take(backend, key)  # CROSSSLOT would fail it
    state = backend.read(key)
    assert state.queue is not None and state.queue.token == "t-" + key
    assert list(backend.scan()) == [key]  # and scan reads the key back from its names
    backend.finish(key, "t-" + key)
    assert backend.read(key).free


def test_odd_keys_never_meet_each_other_or_an_ordinary_key(backend: RedisBackend) -> None:
    keys = [*ODD_KEYS, "x", "~{", "~{0}", "c:{x}"]
    every = [name for key in keys for name in backend._keys(key)]
    assert len(set(every)) == len(every)
    for key in keys:
        _take(backend, key)
    assert sorted(backend.scan()) == sorted(keys)


_PREFIXES = st.sampled_from(["uniqjob:", "uniqjob:c:", "t1:"])
_PARTS = ["q", "r", "f", "meta"]


@given(_PREFIXES, st.text(), st.text())
def test_names_are_one_slot_reversible_and_never_shared(prefix: str, a: str, b: str) -> None:
    mine = names(prefix, a, _PARTS)
    assert len({key_slot(name.encode()) for name in mine}) == 1
    assert [key_of(prefix, name, part) for name, part in zip(mine, _PARTS, strict=True)] == [a] * len(_PARTS)
    if a != b:
        assert not set(mine) & set(names(prefix, b, _PARTS))


def test_ordinary_keys_keep_the_redis_names_they_had(backend: RedisBackend) -> None:
    # Existing data must stay readable: these are the names 0.x wrote.
    key = "jobs.Export:1:0f3a"
    assert backend._keys(key) == [
        "c:{jobs.Export:1:0f3a}:q",
        "c:{jobs.Export:1:0f3a}:r",
        "c:{jobs.Export:1:0f3a}:f",
    ]
    semaphores = backend.semaphores()
    assert isinstance(semaphores, RedisSemaphores)
    assert semaphores._keys("a}b")[0] == "c:c:{a}b}:slots"
    assert backend._keys("}a") != ["c:{}a}:q", "c:{}a}:r", "c:{}a}:f"]


def test_scan_sees_every_primary(backend: RedisBackend, cluster: Cluster) -> None:
    keys = [f"jobs.K:{i}" for i in range(30)]
    for key in keys:
        _take(backend, key)
    owners = {cluster.master_of(backend._keys(key)[0]).port for key in keys}
    assert len(owners) == 3  # the keys are spread over all three primaries
    assert sorted(backend.scan()) == sorted(keys)
    assert sorted(str(row.key) for row in ops.iter_rows(backend)) == sorted(keys)


def test_a_lone_run_lock_is_listed_whichever_node_holds_it(backend: RedisBackend, cluster: Cluster) -> None:
    # The queue locks gone (autoexpired, say): scan asks whether each still exists, across slots.
    keys = [f"jobs.K:{i}" for i in range(12)]
    for key in keys:
        _take(backend, key)
        backend.client.delete(backend._keys(key)[0])
    assert sorted(backend.scan()) == sorted(keys)


def _acquire(store: SemaphoreStore, key: str) -> None:
    out = store.acquire(
        key, "tok", limit=1, lease=30, running=False, holder=None, park=None,
        job_class="jobs.S", args="", caller=local_holder(),
    )  # fmt: skip
    assert out.status == "taken"


def test_semaphore_scan_sweep_and_figures_see_every_primary(backend: RedisBackend) -> None:
    store = store_for(backend)
    keys = [*(f"jobs.S:{i}" for i in range(20)), "}odd", ""]
    for key in keys:
        _acquire(store, key)
    assert sorted(store.scan()) == sorted(keys)
    assert sorted(report.key for report in ops.iter_keys(backend)) == sorted(keys)
    assert sweep(backend) == 0


def _node_id(server: Any) -> str:
    with _client(server) as client:
        return str(_cmd(client, "CLUSTER", "MYID").decode())


def _on_every_master(cluster: Cluster, *args: Any) -> None:
    for server in cluster.primaries():
        with _client(server) as client:
            _cmd(client, *args)


def _reshard(cluster: Cluster, names: list[str], then: Callable[[], None]) -> None:
    """Move the slot of ``names`` to another primary; ``then()`` while both hold a copy of them."""
    slot = _slot(cluster, names[0])
    source = cluster.master_of(names[0])
    target = next(server for server in cluster.primaries() if server.port != source.port)
    with _client(source) as src, _client(target) as dst:
        _cmd(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", _node_id(source))
        _cmd(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", _node_id(target))
        # A copy on the target while the source keeps its own: both primaries list the names.
        _cmd(src, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "COPY", "KEYS", *names)
        then()
        # The reshard finishes: the names live on the target alone, and the client follows them.
        _cmd(src, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "REPLACE", "KEYS", *names)
        _on_every_master(cluster, "CLUSTER", "SETSLOT", slot, "NODE", _node_id(target))
    cluster.wait_healthy()


def test_a_key_met_on_two_primaries_mid_reshard_is_listed_once(
    backend: RedisBackend, cluster: Cluster
) -> None:
    key = "jobs.Moving:1"
    _take(backend, key)
    semaphores = store_for(backend)
    assert isinstance(semaphores, RedisSemaphores)
    _acquire(semaphores, key)

    def listed_once() -> None:
        assert list(backend.scan()) == [key]
        assert list(semaphores.scan()) == [key]

    # A key's locks and its semaphore share the hash tag, so the slot: one reshard moves both.
    names = [name for name in [*backend._keys(key), *semaphores._keys(key)] if backend.client.exists(name)]
    _reshard(cluster, names, listed_once)
    listed_once()
    state = backend.read(key)
    assert state.run is not None and state.run.token == "t-" + key
    assert len(semaphores.read(key).slots) == 1


def test_scripts_flushed_on_every_node_are_loaded_again(backend: RedisBackend, cluster: Cluster) -> None:
    _take(backend, "warm")
    semaphores = store_for(backend)
    _on_every_master(cluster, "SCRIPT", "FLUSH")
    _take(backend, "after")
    assert backend.read("after").queue is not None
    _acquire(semaphores, "s")


def test_read_many_reads_keys_of_every_slot_sync_and_awaited(backend: RedisBackend) -> None:
    keys = [f"many{n}" for n in range(12)]  # their slots spread over every primary
    for key in keys[::2]:
        _take(backend, key)

    def held(states: list[Any]) -> list[bool]:
        return [not isinstance(s, Exception) and s.queue is not None for s in states]

    expected = [n % 2 == 0 for n in range(12)]
    assert held(backend.read_many(keys)) == expected
    face = async_backend(backend)
    assert isinstance(face, RedisAsync)

    async def main() -> list[bool]:
        try:
            return held(await face.read_many(keys))  # one pipeline: each READ to its slot's primary
        finally:
            await face.aclose()

    assert asyncio.run(main()) == expected


def test_a_valkey_py_cluster_client_keeps_the_lock_cycle(cluster: Cluster) -> None:
    valkey_cluster = pytest.importorskip("valkey.cluster", reason="valkey-py is not installed")
    seeds = [valkey_cluster.ClusterNode("127.0.0.1", port) for port in cluster.ports[:3]]
    client = valkey_cluster.ValkeyCluster(startup_nodes=seeds, socket_timeout=5)
    backend = RedisBackend(client, namespace="vk")
    assert repr(backend).startswith("RedisBackend(cluster [127.0.0.1:")
    for key in ["a", "}b", "c{d}"]:
        _take(backend, key)
    _on_every_master(cluster, "SCRIPT", "FLUSH")
    _take(backend, "after-flush")
    assert sorted(backend.scan()) == sorted(["a", "}b", "c{d}", "after-flush"])
    assert sorted(store_for(backend).scan()) == []
    backend.close()


# -- a cluster of this module's own, to kill a master of --------------------------------


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[Cluster]:
    with Cluster() as cluster:
        yield cluster


def _replica_of(cluster: Cluster, master: RedisServer) -> int:
    """The pid of ``master``'s replica in ``cluster``."""
    for server in cluster.live():
        with _client(server) as client:
            role = _cmd(client, "ROLE")
        if role[0] in (b"slave", "slave") and int(role[2]) == master.port and server.pid is not None:
            return server.pid
    raise RuntimeError(f"no replica of {master.port}")


@pytest.mark.slow
def test_a_killed_master_fails_calls_with_backend_errors_until_its_replica_takes_over(
    own_cluster: Cluster,
) -> None:
    client = cluster_client(own_cluster, socket_timeout=1, socket_connect_timeout=1)
    backend = RedisBackend(client, namespace="kill")
    key = "jobs.Kill:1"
    _take(backend, key)
    victim = own_cluster.master_of(backend._keys(key)[0])
    # Its replica is paused until a call has failed: the window is seen however slow the machine
    # (a loaded one could spend the whole failover inside the client's own retries of one call).
    replica = _replica_of(own_cluster, victim)
    os.kill(replica, signal.SIGSTOP)
    try:
        own_cluster.kill(victim)
        errors: list[BaseException] = []
        started = time.monotonic()
        recovered = None
        while time.monotonic() - started < 30:
            call = time.monotonic()
            try:
                state = backend.read(key)
            except BackendError as failed:
                errors.append(failed)
                os.kill(replica, signal.SIGCONT)  # now it may take over
            else:
                recovered = time.monotonic() - started
                break
            finally:
                assert time.monotonic() - call < 15, "a call hung past its timeouts"
    finally:
        os.kill(replica, signal.SIGCONT)
    assert recovered is not None, f"no recovery in 30 s: {errors[-1:]}"
    assert errors, "the failover was never seen"
    for error in errors:
        assert isinstance(error.__cause__, redis.RedisError | redis.exceptions.RedisClusterException)
        assert "cluster [" in str(error) and "None:None" not in str(error)
    # Whether the lock outlived its master depends on whether it reached the replica first:
    # without replica acknowledgement that is timing, so only the read itself is checked.
    assert state.key == key
    backend.close()


def _slot_status(store: SemaphoreStore, key: str, token: str) -> str:
    """One concurrency-only call (a slot with no lock around it): "ok", or the BackendError's text."""
    me = local_holder()
    try:
        store.acquire(
            key, token, limit=100_000, lease=60, running=True, holder=me, park=None,
            job_class="jobs.S", args="", caller=me,
        )  # fmt: skip
    except BackendError as failed:
        return str(failed)
    return "ok"


def _until(what: str, seconds: float, call: Callable[[], str], done: Callable[[str], bool]) -> list[str]:
    """Call ``call`` until ``done`` with its result, each call bounded in time; every result seen."""
    seen: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        began = time.monotonic()
        seen.append(call())
        assert time.monotonic() - began < 10, "a call hung past its timeouts"
        if done(seen[-1]):
            return seen
        time.sleep(0.05)
    raise AssertionError(f"no {what} in {seconds}s: last {seen[-3:]}")


@pytest.mark.slow
def test_acknowledged_slots_reach_the_new_master_after_kill_9_of_the_old() -> None:
    """replicas=1 on a cluster: a call that fails on a dead master has the client read the slot map again."""
    with Cluster() as own:
        client = cluster_client(own, socket_timeout=1, socket_connect_timeout=1)
        store = RedisBackend(client, namespace="sk", replicas=1, replica_timeout=0.25).semaphores()
        assert isinstance(store, RedisSemaphores)
        key = "jobs.Slot:1"
        tokens = (f"t{n}" for n in range(100_000))
        assert _slot_status(store, key, next(tokens)) == "ok"
        victim = own.master_of(store._keys(key)[0])
        own.kill(victim)
        # The replica is promoted and has no replica of its own: grants reach it and fail closed.

        def call() -> str:
            return _slot_status(store, key, next(tokens))

        seen = _until("call reaching the promoted replica", 30, call, lambda t: "(which has 0 replicas" in t)
        assert "ok" not in seen and "acknowledged by 0 of 1 replicas" in seen[-1]
        assert own.master_of(store._keys(key)[0]).port != victim.port
        # The old master comes back as the new one's replica: grants are acknowledged again.
        victim.start()
        _until("acknowledged grant", 60, call, lambda t: t == "ok")
        client.close()
