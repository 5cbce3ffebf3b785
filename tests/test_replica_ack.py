"""Replica acknowledgement (``replicas=N``): every grant waits for N replicas, or is undone and fails closed.

Against real servers started here: a master with one replica (for both the
client's default pool and a blocking one), and a Redis Cluster of 3 masters
with a replica each. A replica is stopped (SIGSTOP) to make a grant go
unacknowledged: ``WAIT`` then counts 0 of 1 until ``replica_timeout``.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from tests.conftest import sentinel_client
from tests.integration_workers import wait_until
from tests.redis_server import RedisServer
from tests.support import sigstop
from tests.support.topologies import Cluster, SentinelGroup
from uniqjob import JobLock
from uniqjob._undo import undos
from uniqjob.errors import BackendError, ConfigurationError, CorruptRecordError
from uniqjob.locks import QueueMeta, RunClaim, local_holder
from uniqjob.stores.redis import RedisBackend
from uniqjob.stores.semaphores import Park

TIMEOUT = 0.5  # replica_timeout of these tests, in seconds
META = QueueMeta("tests.Job", "[]")


class Pair:
    """A master and its one replica."""

    def __init__(self, master: RedisServer, replica: RedisServer) -> None:
        self.master, self.replica = master, replica
        self.admin = redis.Redis(port=master.port, socket_timeout=10)

    def synced(self) -> None:
        """Until the replica is online and has acknowledged every write so far."""
        wait_until(lambda: self.admin.wait(1, 200) >= 1, "the replica to catch up")

    @contextmanager
    def replica_stopped(self, pid: int | None = None) -> Iterator[None]:
        """The replica stopped (SIGSTOP) for the block: it acknowledges nothing, then catches up."""
        pid = pid or self.replica.pid
        assert pid is not None
        sigstop(pid)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with (
        RedisServer(extra_args=("--repl-diskless-sync-delay", "0")) as master,
        RedisServer(extra_args=("--replicaof", "127.0.0.1", str(master.port))) as replica,
    ):
        group = Pair(master, replica)
        group.synced()
        yield group
        group.admin.close()


# (ids that are not tests/conftest.py STORES kinds: a "valkey-py" id would be deselected here)
@pytest.fixture(params=["plain", "blocking", "valkey.Valkey"])
def store(request: pytest.FixtureRequest, pair: Pair) -> Iterator[RedisBackend]:
    """A backend with ``replicas=1`` on the master: redis-py's default pool, a blocking pool, or valkey-py."""
    pair.admin.flushall()
    pair.synced()
    client: Any
    if request.param == "plain":
        client = redis.Redis(port=pair.master.port, socket_timeout=5)
    elif request.param == "valkey.Valkey":
        valkey = pytest.importorskip("valkey")
        client = valkey.Valkey(port=pair.master.port, socket_timeout=5)
    else:
        client = redis.Redis(
            connection_pool=redis.BlockingConnectionPool(port=pair.master.port, socket_timeout=5)  # type: ignore[no-untyped-call]
        )
    backend = RedisBackend(client, replicas=1, replica_timeout=TIMEOUT, namespace="acks")
    undos.clear()
    yield backend
    undos.clear()
    backend.close()


def _run_claim() -> RunClaim:
    return RunClaim(local_holder(), 30.0, "attempt-1")


def _failed_in_time(began: float) -> None:
    took = time.monotonic() - began
    assert TIMEOUT * 0.9 <= took < TIMEOUT + 2.0, f"failed after {took:.2f}s, not about {TIMEOUT}s"


def test_acknowledged_grants_are_granted(store: RedisBackend, pair: Pair) -> None:
    run = _run_claim()
    assert store.claim("k", "t1", meta=META) is None
    assert store.start("k", "t1", run=run, meta=META) is None
    assert run.fence > 0
    assert store.renew("k", "t1", 30.0, run.attempt)
    other = _run_claim()
    assert store.claim("j", "t2", meta=META, run=other) is None
    # the replica holds them too: what a promoted replica would serve
    replica = redis.Redis(port=pair.replica.port)
    assert replica.hget("acks:{k}:r", "t") == b"t1"
    assert replica.hget("acks:{j}:q", "t") == b"t2"
    replica.close()
    store.finish("k", "t1")
    assert store.read("k").queue is None


@pytest.mark.slow
def test_an_unacknowledged_claim_is_undone_and_fails_closed(store: RedisBackend, pair: Pair) -> None:
    assert store.claim("other", "held", meta=META) is None  # another's lock, acknowledged
    with pair.replica_stopped():
        began = time.monotonic()
        with pytest.raises(
            BackendError, match=r"acknowledged by 0 of 1 replicas within 0.5s; undone"
        ) as caught:
            store.claim("k", "mine", meta=META)
        _failed_in_time(began)
        assert "the queue lock of 'k'" in str(caught.value)
        assert store.read("k").queue is None  # not left held on the master
        with pytest.raises(BackendError, match=r"queue and run locks of 'r'.*; undone"):
            store.claim("r", "mine2", meta=META, run=_run_claim())
        state = store.read("r")
        assert state.queue is None and state.run is None
        held = store.read("other").queue
        assert held is not None and held.token == "held"  # nothing else's lock is touched
    pair.synced()
    assert store.claim("k", "later", meta=META) is None


@pytest.mark.slow
def test_an_unacknowledged_start_drops_its_run_lock(store: RedisBackend, pair: Pair) -> None:
    assert store.claim("k", "t", meta=META) is None
    with pair.replica_stopped():
        began = time.monotonic()
        with pytest.raises(BackendError, match=r"the run lock of 'k', granted on the master.*; undone"):
            store.start("k", "t", run=_run_claim(), meta=META)
        _failed_in_time(began)
        state = store.read("k")
        assert state.run is None  # the job does not run: no run lock left
        assert state.queue is not None and state.queue.token == "t"
    pair.synced()
    # the queue lock a failed start leaves is an orphan (running, no run lock): the next claim takes the key
    assert store.claim("k", "next", meta=META, run=_run_claim()) is None


@pytest.mark.slow
def test_an_unacknowledged_renewal_is_not_confirmed(store: RedisBackend, pair: Pair) -> None:
    run = _run_claim()
    assert store.claim("k", "t", meta=META, run=run) is None
    with pair.replica_stopped():
        with pytest.raises(
            BackendError, match=r"the lease of the run lock of 'k', extended.*; not confirmed"
        ):
            store.renew("k", "t", 30.0, run.attempt)
        held = store.read("k").run
        assert held is not None and held.token == "t"  # a renewal is not undone: the holder keeps its lock


@pytest.mark.slow
def test_a_conflict_grants_nothing_and_is_not_refused(store: RedisBackend, pair: Pair) -> None:
    assert store.claim("k", "first", meta=META) is None
    with pair.replica_stopped():
        state = store.claim("k", "second", meta=META)
    assert state is not None and state.queue is not None and state.queue.token == "first"


@pytest.mark.slow
def test_the_job_does_not_run_and_a_failed_undo_is_retried(store: RedisBackend, pair: Pair) -> None:
    """The undo fails too (the master refuses it): the error says so, and JobLock's undo removes it later."""
    admin = pair.admin
    ran = []

    def refuse_scripts_once_waiting() -> None:
        # once the claim's WAIT blocks (its script ran), scripts are refused: the undo cannot run
        wait_until(
            lambda: any(c["cmd"] == "wait" and "b" in c["flags"] for c in admin.client_list()),
            "the WAIT to block",
        )
        admin.execute_command("ACL", "SETUSER", "default", "-evalsha")  # type: ignore[no-untyped-call]

    refusing = threading.Thread(target=refuse_scripts_once_waiting)
    assert store.claim("warm", "w", meta=META) is None  # the script loaded: the claim's WAIT is its grant's
    lock = JobLock(store, "k", meta=META)
    token = lock.token
    try:
        with pair.replica_stopped():
            refusing.start()
            with pytest.raises(
                BackendError,
                match=r"undoing it failed too \(this user has no permissions.*\): it stays on the master",
            ):
                if lock.acquire():
                    ran.append(True)
            refusing.join()
            assert admin.hget("acks:{k}:q", "t") == token.encode()  # left, as the error says
            # JobLock's undo of an ambiguous claim takes it from here (it cannot succeed before the
            # scripts are allowed again, below: its first background try may come after that)
            assert undos.pending
    finally:
        admin.execute_command("ACL", "SETUSER", "default", "+evalsha")  # type: ignore[no-untyped-call]
    assert not ran
    wait_until(lambda: store.read("k").queue is None, "the background undo of the claim")


def test_a_script_error_and_a_lost_script_cache_keep_the_connection_in_step(
    store: RedisBackend, pair: Pair
) -> None:
    pair.admin.set("acks:{bad}:q", "not a hash")  # the script's error reply comes before WAIT's
    with pytest.raises(CorruptRecordError, match=re.escape("acks:{bad}:q")):
        store.claim("bad", "t", meta=META)
    assert store.claim("good", "t", meta=META) is None  # WAIT's reply was read with it: nothing left over
    pair.admin.script_flush()  # NOSCRIPT: loaded again, and the pair sent again
    assert store.claim("after-flush", "t", meta=META, run=_run_claim()) is None
    assert store.semaphores().read("none").slots == ()
    pair.admin.script_flush()
    assert _acquire(store, "slot-after-flush", "t") == "taken"


def test_replica_timeout_must_fit_in_the_socket_timeout(pair: Pair) -> None:
    client = redis.Redis(port=pair.master.port, socket_timeout=1.0)
    with pytest.raises(ConfigurationError, match=r"replica_timeout \(1.0s\) must be shorter .* \(1.0s\)"):
        RedisBackend(client, replicas=1, replica_timeout=1.0)
    RedisBackend(client, replicas=0, replica_timeout=1.0)  # no wait: no limit
    client.close()


def test_the_socket_timeout_must_leave_headroom_after_the_wait(pair: Pair) -> None:
    client = redis.Redis(port=pair.master.port, socket_timeout=5.0)
    with pytest.raises(
        ConfigurationError, match=r"replica_timeout \(4.999s\) must be shorter .* by at least 0.5s"
    ):
        RedisBackend(client, replicas=1, replica_timeout=4.999)
    assert RedisBackend(client, replicas=1, replica_timeout=4.5).replica_timeout == 4.5
    client.close()


@pytest.mark.slow
def test_an_unacknowledged_grant_says_how_many_replicas_the_master_has(
    store: RedisBackend, pair: Pair
) -> None:
    with pair.replica_stopped():  # stopped, not gone: the master still counts it connected
        with pytest.raises(BackendError, match=r"on the master \(which has 1 replica connected\) but"):
            store.claim("k", "mine", meta=META)
        with pytest.raises(BackendError, match=r"on the master \(which has 1 replica connected\) but"):
            _acquire(store, "s", "mine")


def test_a_corrupt_slot_record_met_by_a_grant_is_named(store: RedisBackend, pair: Pair) -> None:
    slots = store.semaphores()._keys("bad")[0]  # type: ignore[attr-defined]
    pair.admin.set(slots, "garbage")  # a string where a hash belongs
    with pytest.raises(CorruptRecordError) as caught:
        _acquire(store, "bad", "t")
    assert caught.value.path == slots


# -- slots --------------------------------------------------------------------------------


def _acquire(store: RedisBackend, key: str, token: str, *, park: Park | None = None) -> str:
    me = local_holder()
    outcome = store.semaphores().acquire(
        key, token, limit=1, lease=30.0, running=park is None, holder=me if park is None else None,
        park=park, job_class="tests.Job", args="[]", caller=me,
    )  # fmt: skip
    return outcome.status


@pytest.mark.slow
def test_an_unacknowledged_slot_is_released_and_fails_closed(store: RedisBackend, pair: Pair) -> None:
    semaphores = store.semaphores()
    assert _acquire(store, "other", "held") == "taken"
    with pair.replica_stopped():
        began = time.monotonic()
        with pytest.raises(BackendError, match=r"the slot of mine of 'k', granted on the master.*; undone"):
            _acquire(store, "k", "mine")
        _failed_in_time(began)
        assert semaphores.read("k").slots == ()
        assert [slot.token for slot in semaphores.read("other").slots] == ["held"]


@pytest.mark.slow
def test_an_unacknowledged_slot_start_releases_it(store: RedisBackend, pair: Pair) -> None:
    semaphores = store.semaphores()
    me = local_holder()
    reserved = semaphores.acquire(
        "k", "t", limit=1, lease=30.0, running=False, holder=None, park=None, job_class="tests.Job",
        args="[]", caller=me,
    )  # fmt: skip
    assert reserved.status == "taken"
    with pair.replica_stopped():
        with pytest.raises(BackendError, match=r"the slot of t of 'k', granted.*; undone"):
            semaphores.start("k", "t", holder=me, lease=30.0, takeover=None, caller=me)
        assert semaphores.read("k").slots == ()


@pytest.mark.slow
def test_a_release_whose_promotion_is_unacknowledged_fails_closed(store: RedisBackend, pair: Pair) -> None:
    semaphores = store.semaphores()
    me = local_holder()
    assert _acquire(store, "k", "first") == "taken"
    assert _acquire(store, "k", "parked", park=Park("queue", "payload", None, 0.0)) == "parked"
    with pair.replica_stopped():
        with pytest.raises(BackendError, match="1 promoted call of 'k', granted on the master"):
            semaphores.release("k", "first", caller=me)
        slots = semaphores.read("k").slots
        # the release is done; the promotion stays with its handoff, pushed again once that lapses
        assert [(slot.token, slot.status) for slot in slots] == [("parked", "promoted")]


# -- cluster ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster() as started:
        started.wait_replicas_in_sync()
        yield started


def _replica_of(cluster: Cluster, master: RedisServer) -> RedisServer:
    for server in cluster.servers:
        with redis.Redis(port=server.port) as client:
            role = client.role()
            if role[0] == b"slave" and int(role[2]) == master.port:
                return server
    raise AssertionError(f"no replica of {master.port}")


@pytest.mark.slow
def test_cluster_grants_are_acknowledged_on_the_master_that_owns_the_key(cluster: Cluster) -> None:
    seeds = [ClusterNode("127.0.0.1", p) for p in cluster.ports[:3]]  # type: ignore[no-untyped-call]
    client = RedisCluster(startup_nodes=seeds)
    store = RedisBackend(client, replicas=1, replica_timeout=TIMEOUT, namespace="acks")
    keys = [f"key-{n}" for n in range(12)]
    owners = {key: cluster.master_of("acks:{" + key + "}:q") for key in keys}
    assert len({owner.port for owner in owners.values()}) == 3  # the keys span every master
    for key in keys:
        assert store.claim(key, f"t-{key}", meta=META, run=_run_claim()) is None
        assert _acquire(store, key, f"s-{key}") == "taken"
    stalled = owners[keys[0]]
    fresh = [f"fresh-{n}" for n in range(12)]
    on_stalled = next(k for k in fresh if cluster.master_of("acks:{" + k + "}:q").port == stalled.port)
    elsewhere = next(k for k in fresh if cluster.master_of("acks:{" + k + "}:q").port != stalled.port)
    replica = _replica_of(cluster, stalled)
    assert replica.pid is not None
    sigstop(replica.pid)
    try:
        with pytest.raises(BackendError, match=r"acknowledged by 0 of 1 replicas within 0.5s; undone"):
            store.claim(on_stalled, "t", meta=META)
        assert store.read(on_stalled).queue is None
        assert store.claim(elsewhere, "t", meta=META) is None  # its master's replica is up
        held = store.read(keys[0]).run
        assert held is not None and held.token == f"t-{keys[0]}"
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    store.close()


def _node_id(server: RedisServer) -> str:
    with redis.Redis(port=server.port, decode_responses=True) as client:
        return str(client.execute_command("CLUSTER", "MYID"))


def _setslot(server: RedisServer, *args: object) -> None:
    with redis.Redis(port=server.port) as client:
        client.execute_command("CLUSTER", "SETSLOT", *args)


def _cluster_client(cluster: Cluster, kind: str, **kwargs: Any) -> Any:
    """A cluster client of ``kind``: redis-py's RedisCluster, or valkey-py's ValkeyCluster."""
    if kind == "ValkeyCluster":
        valkey_cluster = pytest.importorskip("valkey.cluster")
        nodes = [valkey_cluster.ClusterNode("127.0.0.1", p) for p in cluster.ports[:3]]
        return valkey_cluster.ValkeyCluster(startup_nodes=nodes, **kwargs)
    seeds = [ClusterNode("127.0.0.1", p) for p in cluster.ports[:3]]  # type: ignore[no-untyped-call]
    return RedisCluster(startup_nodes=seeds, **kwargs)


@pytest.mark.parametrize("kind", ["RedisCluster", "ValkeyCluster"])
@pytest.mark.slow
def test_cluster_redirects_are_followed_once(cluster: Cluster, kind: str) -> None:
    """A slot that moved since the client read its map (MOVED), and one that is moving (ASK).

    Through either library's cluster client: each names its nodes' clients, and its redirect
    errors, its own way.
    """
    client = _cluster_client(cluster, kind)
    store = RedisBackend(client, replicas=1, replica_timeout=TIMEOUT, namespace="moves")
    moving, moved = f"moving-key-{kind}", f"moved-key-{kind}"
    for key in (moving, moved):
        # the client's slot map is read now; then the key's empty slot goes to another master
        assert store.renew(key, "nobody", 30.0) is False
        source = cluster.master_of("moves:{" + key + "}:r")
        target = next(m for m in cluster.primaries() if m.port != source.port)
        with redis.Redis(port=source.port) as admin:
            slot = admin.cluster("KEYSLOT", "moves:{" + key + "}:r")
        _setslot(target, slot, "IMPORTING", _node_id(source))
        _setslot(source, slot, "MIGRATING", _node_id(target))
        if key == moved:
            for master in cluster.primaries():
                _setslot(master, slot, "NODE", _node_id(target))
            # MOVED: the map is read again and the claim sent to the new owner, acknowledged by its replica
            assert store.claim(key, "t", meta=META, run=_run_claim()) is None
            assert cluster.master_of("moves:{" + key + "}:r").port == target.port
        else:
            # ASK (the key is not on the source): the one-key renewal is sent to the target after ASKING
            assert store.renew(key, "nobody", 30.0) is False
            for master in cluster.primaries():
                _setslot(master, slot, "NODE", _node_id(source))  # back where it was
    store.close()


@pytest.mark.parametrize("kind", ["RedisCluster", "ValkeyCluster"])
@pytest.mark.slow
def test_a_cluster_client_s_socket_timeout_must_leave_headroom_after_the_wait(
    cluster: Cluster, kind: str
) -> None:
    client = _cluster_client(cluster, kind, socket_timeout=1.0)
    with pytest.raises(
        ConfigurationError, match=r"replica_timeout \(0.75s\) must be shorter .* \(1.0s\) by at"
    ):
        RedisBackend(client, replicas=1, replica_timeout=0.75)
    RedisBackend(client, replicas=1, replica_timeout=0.5).close()


@pytest.mark.slow
def test_a_sentinel_client_s_socket_timeout_must_leave_headroom_after_the_wait(
    sentinel_group: SentinelGroup,
) -> None:
    client = sentinel_client(sentinel_group, socket_timeout=1.0)
    with pytest.raises(
        ConfigurationError, match=r"replica_timeout \(0.75s\) must be shorter .* \(1.0s\) by at"
    ):
        RedisBackend(client, replicas=1, replica_timeout=0.75)
    RedisBackend(client, replicas=1, replica_timeout=0.5).close()
