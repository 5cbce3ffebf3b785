"""The Redis store through faults (issue 10): lost replies, cluster and foreign clients.

Each test that stalls or kills a server runs its own, never the session's:
``SIGSTOP`` holds every reply while the kernel still takes what the client
sends, so the server applies a call after the client gave up on it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import ConstantBackoff, NoBackoff
from redis.retry import Retry

from tests.redis_server import RedisServer, find_redis_server
from uniqjob.errors import BackendError
from uniqjob.locks import LockState, QueueMeta, RunClaim, local_holder
from uniqjob.stores.redis import RedisBackend

TIMEOUT = 0.5  # the client's socket timeout: each stall below outlasts it
HOLDER = local_holder()
META = QueueMeta("Job", "(1,)")


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as own:
        yield own


@contextmanager
def stalled(server: RedisServer) -> Iterator[Callable[[], None]]:
    """Hold every reply of ``server`` (SIGSTOP) until the block ends or ``resume()`` is called."""
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)

    def resume() -> None:
        os.kill(pid, signal.SIGCONT)

    try:
        yield resume
    finally:
        resume()


def _client(server: RedisServer, kind: str, retry: Retry) -> redis.Redis:
    """A client of ``kind``: "pool" (redis-py's default pool) or "blocking" (a ``BlockingConnectionPool``)."""
    options: dict[str, Any] = {"socket_timeout": TIMEOUT, "socket_connect_timeout": TIMEOUT, "retry": retry}
    # redis-py 5 retries only the errors named here; from 6 on, the Retry's own (these same two)
    options["retry_on_error"] = [redis.ConnectionError, redis.TimeoutError]
    if kind == "pool":
        return redis.Redis.from_url(server.url, **options)
    return redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(server.url, **options))


def _backend(server: RedisServer, kind: str, retry: Retry) -> RedisBackend:
    client = _client(server, kind, retry)
    client.flushall()
    backend = RedisBackend(client, namespace="faults")
    # Connected and every script loaded: the stall hits the call, not its setup (a NOSCRIPT reply).
    assert backend.claim("warm", "w", meta=META) is None
    backend.finish("warm", "w")
    assert backend.claim("warm", "w", meta=META, run=RunClaim(HOLDER, 30.0)) is None
    assert backend.start("warm", "w", run=RunClaim(HOLDER, 30.0), meta=META) is None
    assert backend.renew("warm", "w", 30.0)
    backend.finish("warm", "w")
    return backend


def _until_held(backend: RedisBackend, token: str, *, run: bool) -> LockState:
    """The state once the server, resumed, has applied the call whose reply was lost."""
    deadline = time.monotonic() + 5
    while True:
        state = backend.read("k")
        held = state.run if run else state.queue
        if held is not None and held.token == token:
            return state
        assert time.monotonic() < deadline, f"the stalled call was never applied: {state!r}"
        time.sleep(0.01)


CALLS: dict[str, Callable[[RedisBackend, RunClaim], LockState | None]] = {
    "claim": lambda b, run: b.claim("k", "t1", meta=META),
    "claim-run": lambda b, run: b.claim("k", "t1", meta=META, run=run),
    "start": lambda b, run: b.start("k", "t1", run=run, meta=META),
}


@pytest.mark.parametrize("kind", ["pool", "blocking"])
@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.slow
def test_a_call_whose_reply_was_lost_succeeds_when_retried_with_its_token(
    server: RedisServer, kind: str, call: str
) -> None:
    # Bug 2: the claim is applied on the server but its reply is lost. The retry
    # (by the caller, once the server answers) must find its own lock, not a duplicate.
    backend = _backend(server, kind, Retry(NoBackoff(), 0))
    first = RunClaim(HOLDER, 30.0, "a1")
    with stalled(server):
        began = time.monotonic()
        with pytest.raises(BackendError, match=r"[Tt]imeout"):
            CALLS[call](backend, first)
        assert time.monotonic() - began < TIMEOUT * 4
    state = _until_held(backend, "t1", run=call != "claim")
    retry = RunClaim(HOLDER, 30.0, "a1")
    assert CALLS[call](backend, retry) is None  # its own lock: taken, not "a duplicate of nothing"
    if call != "claim":
        assert state.run is not None and retry.fence == state.run.fence > 0
    assert backend.claim("k", "t2", meta=META) is not None  # and still one lock: others are refused
    backend.finish("k", "t1")
    assert backend.read("k").free
    backend.close()


@pytest.mark.parametrize("kind", ["pool", "blocking"])
@pytest.mark.slow
def test_redis_pys_own_retry_across_a_stall_finds_the_claim_it_sent(server: RedisServer, kind: str) -> None:
    # The client's retry policy resends the claim after a timeout; the server,
    # resumed in between, has already applied the first copy.
    backend = _backend(server, kind, Retry(ConstantBackoff(1.0), 2))
    run = RunClaim(HOLDER, 30.0, "a1")
    with stalled(server) as resume:
        timer = threading.Timer(TIMEOUT + 0.3, resume)  # after the first timeout, before the resend
        timer.start()
        try:
            assert backend.claim("k", "t1", meta=META, run=run) is None
        finally:
            timer.cancel()
    state = backend.read("k")
    assert state.queue is not None and state.queue.token == "t1" and state.queue.state == "running"
    assert state.run is not None and state.run.fence == run.fence > 0
    backend.close()


@pytest.mark.slow
def test_a_renew_or_finish_retried_after_a_lost_reply_is_harmless(server: RedisServer) -> None:
    backend = _backend(server, "pool", Retry(NoBackoff(), 0))
    run = RunClaim(HOLDER, 30.0, "a1")
    assert backend.claim("k", "t1", meta=META, run=run) is None
    with stalled(server), pytest.raises(BackendError):
        backend.renew("k", "t1", 30.0)
    assert backend.renew("k", "t1", 30.0)
    with stalled(server), pytest.raises(BackendError):
        backend.finish("k", "t1")
    backend.finish("k", "t1")
    assert backend.read("k").free
    backend.close()


# Clients that are not redis.Redis (bug 8): every failure is a BackendError carrying its cause.


def _free_port() -> int:
    """A free port whose cluster bus port (+10000) is free too: Redis refuses a port above 55535."""
    for _ in range(1000):
        with socket.socket() as sock, socket.socket() as bus:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
            if port > 55535:
                continue
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port
    raise AssertionError("no free port with a free cluster bus port")


@contextmanager
def cluster_node(directory: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """A one-node Redis Cluster holding every slot."""
    port = _free_port()
    args = [
        find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
        "--cluster-config-file", str(directory / "nodes.conf"), "--dir", str(directory),
        "--save", "", "--appendonly", "no",
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        admin = redis.Redis(port=port, socket_timeout=2)
        deadline = time.monotonic() + 10
        while True:
            try:
                admin.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None, "the cluster node did not start"
                time.sleep(0.02)
        admin.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)  # type: ignore[no-untyped-call]
        while admin.cluster("info")["cluster_state"] != "ok":
            assert time.monotonic() < deadline, "the cluster never became ready"
            time.sleep(0.02)
        admin.close()
        yield port, proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_a_cluster_client_works_and_its_failures_are_backend_errors(tmp_path: Path) -> None:
    with cluster_node(tmp_path) as (port, proc):
        client = redis.RedisCluster(
            host="127.0.0.1", port=port, socket_timeout=TIMEOUT, retry=Retry(NoBackoff(), 0)
        )
        backend = RedisBackend(client, namespace="c")
        assert f"127.0.0.1:{port}" in repr(backend)  # no connection_pool: named by its nodes
        run = RunClaim(HOLDER, 30.0, "a1")
        assert backend.claim("k", "t1", meta=META, run=run) is None and run.fence > 0
        assert backend.claim("k", "t1", meta=META, run=RunClaim(HOLDER, 30.0, "a1")) is None
        state = backend.read("k")
        assert state.run is not None and state.run.fence == run.fence
        assert list(backend.scan()) == ["k"]
        assert backend.purge("k") == ["c:{k}:q", "c:{k}:r"]
        assert backend.read("k").free
        proc.kill()
        proc.wait()
        for call in (
            lambda: backend.claim("k", "t2", meta=META),
            lambda: backend.finish("k", "t2"),
            lambda: list(backend.scan()),
        ):
            with pytest.raises(BackendError) as caught:
                call()
            assert caught.value.__cause__ is not None and not isinstance(caught.value.__cause__, BackendError)
            assert f"127.0.0.1:{port}" in str(caught.value)
        client.close()


class _Traced(redis.Redis):
    """A client whose instrumentation fails with an error of its own, as wrappers do."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        raise RuntimeError("tracing exporter is down")


def test_any_exception_from_the_client_is_a_backend_error_with_its_cause(server: RedisServer) -> None:
    client = _Traced(connection_pool=redis.BlockingConnectionPool.from_url(server.url))
    backend = RedisBackend(client, namespace="traced")
    for call in (
        lambda: backend.claim("k", "t", meta=META),
        lambda: backend.start("k", "t", run=RunClaim(HOLDER, 30.0), meta=META),
        lambda: backend.finish("k", "t"),
        lambda: backend.read("k"),
        lambda: list(backend.scan()),
        lambda: backend.purge("k"),
    ):
        with pytest.raises(BackendError, match="RuntimeError: tracing exporter is down") as caught:
            call()
        assert isinstance(caught.value.__cause__, RuntimeError)
    assert repr(backend) == f"RedisBackend('127.0.0.1:{server.port}', db=0)"
    client.close()


def test_repr_never_raises_whatever_the_client() -> None:
    class Bare:
        """Not a client at all: the backend still describes itself."""

    backend = RedisBackend.__new__(RedisBackend)
    backend.client = Bare()  # type: ignore[assignment]
    assert repr(backend) == "RedisBackend(a Bare client)"
