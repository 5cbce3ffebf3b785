"""The Redis stores on a Valkey server, through valkey-py's own client (``valkey.Valkey``).

valkey-py is redis-py's fork: the same commands, but exception classes of its
own (not redis-py's) and a connection pool the kept-connection path does not
take. The contract suites run through it too (``valkey-py`` in
tests/conftest.py's STORES); these are the cases that differ: scripts the
server lost, the client's own errors on every path, a record of the wrong kind.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from tests.redis_server import RedisServer
from uniqjob import BackendError, CorruptRecordError
from uniqjob.concurrency import store_for
from uniqjob.locks import QueueMeta, RunClaim, local_holder
from uniqjob.stores.redis import RedisBackend

valkey = pytest.importorskip("valkey", reason="valkey-py is not installed: `pip install valkey`")


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
