"""The Redis stores on a Valkey server, through valkey-py's own client (``valkey.Valkey``).

valkey-py is redis-py's fork: the same commands and public API, but exception
classes of its own (not redis-py's). The contract suites run through it too (``valkey-py`` in
tests/conftest.py's STORES); these are the cases that differ: scripts the
server lost, the client's own errors on every path, a record of the wrong kind,
and a Valkey Cluster (3 masters, 3 replicas of valkey-server) through ``ValkeyCluster``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import HOW_TO_GET_VALKEY
from tests.redis_server import RedisServer
from tests.support.topologies import Cluster, _client, valkey_binary
from uniqjob import BackendError, CorruptRecordError
from uniqjob.concurrency import store_for
from uniqjob.locks import QueueMeta, RunClaim, local_holder
from uniqjob.stores.redis import RedisBackend

valkey = pytest.importorskip("valkey", reason="valkey-py is not installed: `pip install valkey`")
pytest.importorskip("valkey.cluster")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _acquire(backend: RedisBackend, key: str) -> str:
    out = store_for(backend).acquire(
        key, "tok", limit=1, lease=30, running=False, holder=None, park=None,
        job_class="", args="", caller=local_holder(),
    )  # fmt: skip
    return out.status


def test_scripts_load_themselves_and_again_after_a_flush(valkey_py_client: Any) -> None:
    backend = RedisBackend(valkey_py_client, namespace="vk")
    assert backend.claim("k", "t", meta=QueueMeta()) is None  # nothing loaded by hand
    assert _acquire(backend, "s") == "taken"
    valkey_py_client.script_flush()
    assert backend.start("k", "t", run=RunClaim(local_holder(), 5), meta=QueueMeta()) is None
    assert _acquire(backend, "s2") == "taken"
    assert sorted(backend.scan()) == ["k"]
    assert sorted(store_for(backend).scan()) == ["s", "s2"]


def test_repr_names_the_valkey_server(valkey_py_client: Any, valkey_server: RedisServer) -> None:
    backend = RedisBackend(valkey_py_client, namespace="vk")
    assert repr(backend) == f"RedisBackend('127.0.0.1:{valkey_server.port}', db=0)"
    assert repr(backend.semaphores()).startswith(f"RedisSemaphores('127.0.0.1:{valkey_server.port}', db=0")


@pytest.mark.parametrize("call", ["claim", "read", "scan", "acquire", "semaphore scan"])
def test_valkey_py_s_own_errors_are_backend_errors_on_every_path(call: str) -> None:
    port = _closed_port()
    client = valkey.Valkey(host="127.0.0.1", port=port, socket_connect_timeout=1)
    backend = RedisBackend(client, namespace="vk")
    calls: dict[str, Any] = {
        "claim": lambda: backend.claim("k", "t", meta=QueueMeta()),
        "read": lambda: backend.read("k"),
        "scan": lambda: list(backend.scan()),
        "acquire": lambda: _acquire(backend, "s"),
        "semaphore scan": lambda: list(store_for(backend).scan()),
    }
    with pytest.raises(BackendError, match=f"127.0.0.1:{port}") as caught:
        calls[call]()
    cause = caught.value.__cause__
    assert isinstance(cause, valkey.exceptions.ConnectionError)
    # The client's own error: its text as it is, no class name put in front as for a bug's.
    assert "ConnectionError:" not in str(caught.value)


def test_a_semaphore_record_of_the_wrong_kind_is_named_through_valkey_py(valkey_py_client: Any) -> None:
    backend = RedisBackend(valkey_py_client, namespace="vk")
    store = backend.semaphores()
    slots = store._keys("s")[0]  # type: ignore[attr-defined]
    valkey_py_client.set(slots, "garbage")  # a string where a hash belongs
    with pytest.raises(CorruptRecordError) as caught:
        _acquire(backend, "s")
    assert caught.value.path == slots


@pytest.fixture(scope="module")
def valkey_cluster() -> Iterator[Cluster]:
    binary = valkey_binary()
    if binary is None:
        pytest.skip(HOW_TO_GET_VALKEY)
    with Cluster(binary=binary) as cluster:
        yield cluster


@pytest.mark.parametrize("replicas", [0, 1])
@pytest.mark.slow
def test_a_valkey_cluster_through_valkey_py_s_cluster_client(valkey_cluster: Cluster, replicas: int) -> None:
    """The lock and slot cycle; with ``replicas=1``, each grant acknowledged by its master's replica."""
    seeds = [valkey.cluster.ClusterNode("127.0.0.1", port) for port in valkey_cluster.ports[:3]]
    client = valkey.cluster.ValkeyCluster(startup_nodes=seeds, socket_timeout=5)
    client.flushall(target_nodes=valkey.cluster.ValkeyCluster.PRIMARIES)
    backend = RedisBackend(client, namespace="vkc", replicas=replicas)
    assert repr(backend).startswith("RedisBackend(cluster [127.0.0.1:")
    keys = [*(f"jobs.K:{i}" for i in range(12)), "}", "}{", "{}", ""]
    for key in keys:
        assert backend.claim(key, "t", meta=QueueMeta(), run=RunClaim(local_holder(), 30)) is None
        assert _acquire(backend, key) == "taken"
    assert len({valkey_cluster.master_of(backend._keys(key)[0]).port for key in keys}) == 3
    for server in valkey_cluster.primaries():
        with _client(server) as admin:
            admin.script_flush()
    assert backend.start("late", "t", run=RunClaim(local_holder(), 5), meta=QueueMeta()) is None
    assert sorted(backend.scan()) == sorted([*keys, "late"])
    assert sorted(store_for(backend).scan()) == sorted(keys)
    for key in keys:
        backend.finish(key, "t")
    assert sorted(backend.scan()) == ["late"]
    backend.close()
