"""The Redis store on the client's own connections: threads, forks, retries, and healing.

The store calls its scripts through the client's public API (``_wire``), so
its connections are the client's pool's: these tests hold it to what that
must give (no reply ever read by the wrong call, a closed or stalled server
healed, the client's retry policy and nothing more). Every test that takes a
server runs against the session's redis-server and again against its
valkey-server (``redis_server`` and ``own_server`` below).
"""

from __future__ import annotations

import inspect
import itertools
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
import redis
from redis.backoff import AbstractBackoff, NoBackoff
from redis.retry import Retry

from tests.conftest import HOW_TO_GET_VALKEY
from tests.integration_workers import wait_until
from tests.redis_server import RedisServer
from tests.support import sigstop
from tests.support.proxy import FaultProxy
from tests.support.topologies import valkey_binary
from uniqjob import BackendError
from uniqjob.locks import QueueMeta, RunClaim, local_holder
from uniqjob.stores.redis import RedisBackend

SERVERS = ["redis-server", "valkey-server"]


@pytest.fixture(params=SERVERS)
def server_kind(request: pytest.FixtureRequest) -> str:
    """Which server ``redis_server`` is below: the parameter lives here, not on ``redis_server``.

    pytest hands a parameter of ``redis_server`` to every fixture of that name,
    the session's too: its cache key would change at each switch, closing the
    session's redis-server and starting another on a new port, so clients made
    before (an RQ queue's, a configured store's) would meet a closed port.
    """
    return str(request.param)


@pytest.fixture
def redis_server(request: pytest.FixtureRequest, server_kind: str, redis_server: RedisServer) -> RedisServer:
    """The session's redis-server, then its valkey-server (skipped, saying how to get one, without)."""
    if server_kind == "valkey-server":
        return request.getfixturevalue("valkey_server")  # type: ignore[no-any-return]
    return redis_server


def _cycle(backend: RedisBackend, key: str) -> None:
    """Claim, refuse a duplicate, start and finish ``key``: every reply checked."""
    assert backend.claim(key, "t", meta=QueueMeta("c", "a")) is None
    state = backend.claim(key, "u", meta=QueueMeta())
    assert state is not None and state.queue is not None and state.queue.token == "t"
    assert backend.start(key, "t", run=RunClaim(local_holder(), 5), meta=QueueMeta()) is None
    backend.finish(key, "t")
    assert backend.read(key).free


def test_threads_never_share_a_connection(redis_client: redis.Redis) -> None:
    backend = RedisBackend(redis_client, namespace="threads")
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(100):
                _cycle(backend, f"k{n}-{i}")
        except BaseException as exc:  # reported below: a mixed-up reply fails a check
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


def test_a_forked_child_opens_its_own_connection(redis_client: redis.Redis) -> None:
    backend = RedisBackend(redis_client, namespace="fork")
    _cycle(backend, "before")  # the parent's connection is open
    pid = os.fork()
    if pid == 0:  # the child: exits 0 only if every reply it read was its own
        code = 1
        try:
            for i in range(200):
                _cycle(backend, f"child-{i}")
            code = 0
        finally:
            os._exit(code)
    for i in range(200):
        _cycle(backend, f"parent-{i}")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_connection_the_server_closed_is_replaced(redis_server: RedisServer) -> None:
    # No retries at all: only the check before each call can save it, as the pool's does.
    client = redis.Redis.from_url(redis_server.url, retry=Retry(NoBackoff(), 0))
    backend = RedisBackend(client, namespace="killed")
    _cycle(backend, "a")
    admin = redis.Redis.from_url(redis_server.url)
    assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
    _cycle(backend, "b")
    redis_server.restart()
    _cycle(backend, "c")


def test_close_closes_the_clients_connections(redis_server: RedisServer, redis_client: redis.Redis) -> None:
    name = "uniqjob-close-test"
    _cycle(RedisBackend(redis_client, namespace="warm"), "k")  # scripts loaded: no SCRIPT LOAD below
    backend = RedisBackend(redis.Redis.from_url(redis_server.url, client_name=name), namespace="close")
    used, done = threading.Event(), threading.Event()

    def work() -> None:
        _cycle(backend, "in-thread")
        used.set()
        done.wait(30)  # alive while the main thread checks

    def mine() -> int:
        return sum(1 for c in redis_client.client_list() if c.get("name") == name)

    worker = threading.Thread(target=work)
    worker.start()
    try:
        assert used.wait(30)
        _cycle(backend, "here")
        assert mine() >= 1
        backend.close()
        wait_until(lambda: mine() == 0, "the server to see the connections closed", timeout=10)
        _cycle(backend, "after")  # closed is not broken: the next call connects again
        assert mine() == 1
    finally:
        done.set()
        worker.join(30)


def test_threads_that_come_and_go_reuse_the_pools_connections(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    name = "uniqjob-thread-end-test"
    _cycle(RedisBackend(redis_client, namespace="warm"), "k")  # scripts loaded: no SCRIPT LOAD below
    backend = RedisBackend(redis.Redis.from_url(redis_server.url, client_name=name), namespace="ends")
    for n in range(5):  # one after another: a connection per call at a time, never one per thread
        worker = threading.Thread(target=_cycle, args=(backend, f"k{n}"))
        worker.start()
        worker.join(30)
    assert sum(1 for c in redis_client.client_list() if c.get("name") == name) == 1
    backend.close()


class _OwnConnection(redis.Connection):
    """A connection class of the caller's own: redis-py's path is left to it."""


@pytest.mark.parametrize("kind", ["blocking pool", "bounded pool", "single connection", "own class"])
def test_other_clients_work_through_redis_py(redis_server: RedisServer, kind: str) -> None:
    # Their bound on connections is kept: the store opens none of its own.
    if kind == "blocking pool":
        pool = redis.BlockingConnectionPool.from_url(redis_server.url, max_connections=2)
        client = redis.Redis(connection_pool=pool)
    elif kind == "bounded pool":
        client = redis.Redis.from_url(redis_server.url, max_connections=2)
    elif kind == "own class":
        client = redis.Redis.from_url(redis_server.url, connection_class=_OwnConnection)
    else:
        client = redis.Redis.from_url(redis_server.url, single_connection_client=True)
    backend = RedisBackend(client, namespace=f"other-{kind[:6]}")
    _cycle(backend, "k")
    client.script_flush()  # NOSCRIPT is survived on this path too
    _cycle(backend, "é")


class _CountingBackoff(AbstractBackoff):
    """No wait between attempts; counts the failures the retry policy saw."""

    failures = 0

    def reset(self) -> None:
        pass

    def compute(self, failures: int) -> float:
        _CountingBackoff.failures += 1
        return 0


_REDIS_PY = tuple(int(part) for part in redis.__version__.split(".")[:2])
#: No CLIENT SETINFO on connecting: driver_info=None from redis-py 7, lib_name/lib_version before.
_NO_HANDSHAKE: dict[str, Any] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(redis.Redis.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)


def _backoffs(call: Callable[[], object], error: type[Exception]) -> int:
    """The backoffs redis-py's own retry policy takes before ``call`` raises ``error``."""
    _CountingBackoff.failures = 0
    with pytest.raises(error):
        call()
    return _CountingBackoff.failures


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("path", ["pool", "blocking"])
@pytest.mark.slow
def test_retries_are_the_clients_own_policy(redis_server: RedisServer, path: str) -> None:
    def client(**kwargs: Any) -> redis.Redis:
        retry = Retry(_CountingBackoff(), 2)
        if path == "pool":
            return redis.Redis(retry=retry, **kwargs)
        pool = redis.BlockingConnectionPool(retry=retry, **kwargs)  # type: ignore[no-untyped-call]
        return redis.Redis(connection_pool=pool)

    # A server that refuses: the connection is tried as the pool tries it, no more.
    closed = _closed_port()
    own = _backoffs(lambda: client(host="127.0.0.1", port=closed).ping(), redis.ConnectionError)
    assert own == (2 if _REDIS_PY >= (6,) else 0)  # redis-py 5 connects outside its retry
    _CountingBackoff.failures = 0
    refused = RedisBackend(client(host="127.0.0.1", port=closed))
    with pytest.raises(BackendError, match="Connection refused"):
        refused.claim("k", "t", meta=QueueMeta())
    assert _CountingBackoff.failures == own

    # A call that times out: retried twice, then the timeout is raised. The server is kept
    # busy by a loop of a fixed length, not by watching TIME: Valkey's TIME inside a script is
    # the time the script started, so such a loop keeps Valkey busy until its busy-script-time
    # (5 s), long past the retry's reconnect, whose handshake (CLIENT SETINFO) then times out
    # too and is retried by the same policy: 2 + 2 x 2 = 6 backoffs. Without a handshake
    # (RESP2, so no HELLO; driver_info=None, so no CLIENT SETINFO) a reconnect needs no reply,
    # so only the calls time out, on either server, however long each is kept busy.
    timeout = 0.1
    host, port = redis_server.url.removeprefix("redis://").split("/")[0].split(":")
    slow = RedisBackend(
        client(host=host, port=int(port), socket_timeout=timeout, protocol=2, **_NO_HANDSHAKE),
        namespace="slow",
    )
    # Ample (1 s, ten timeouts): only longer than a timeout matters, and a loop timed on a loaded
    # machine runs faster once it is quieter.
    busy = _busy_script(redis_server, seconds=timeout * 10)
    slow.claim("warm", "t", meta=QueueMeta())  # connected: from here on only the call can fail
    slow._claim.script, slow._claim.sha = busy, slow.client.script_load(busy)
    _CountingBackoff.failures = 0
    with pytest.raises(BackendError, match="Timeout"):
        slow.claim("k", "t", meta=QueueMeta())
    # redis-py 5 retries a call only on the errors given as retry_on_error (none here)
    assert _CountingBackoff.failures == (2 if _REDIS_PY >= (6,) else 0)
    with redis.Redis.from_url(redis_server.url) as admin:
        admin.ping()  # the server done with the calls that timed out, for the tests that follow


def _busy_script(server: RedisServer, seconds: float) -> str:
    """A script that keeps ``server`` busy about ``seconds``: an empty loop, its length measured here."""
    loop = "for i = 1, %d do end return 1"
    count, took = 1_000_000, 0.0
    with redis.Redis.from_url(server.url) as admin:
        while took < 0.05:  # a sample long enough to scale from
            count *= 2
            started = time.monotonic()
            admin.eval(loop % count, 0)
            took = time.monotonic() - started
    return loop % int(count * seconds / took)


def test_a_unix_socket(redis_server: RedisServer) -> None:
    backend = RedisBackend(redis_server.unix_url, namespace="unix")
    _cycle(backend, "k")
    backend.close()


def test_a_client_with_health_checks(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url, health_check_interval=1)
    backend = RedisBackend(client, namespace="health")
    _cycle(backend, "k")
    time.sleep(1.1)  # idle past the interval: the client PINGs before its next command
    _cycle(backend, "k2")


# -- healing: every path recovers from a stalled, dropped or restarted server -------------------

_TIMEOUT = 0.3  # the socket timeout of the clients below: a stall longer than this fails a call


@pytest.fixture(scope="module", params=SERVERS)
def own_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A redis-server, then a valkey-server, of this module's own, to stall (SIGSTOP) and restart."""
    binary = None
    if request.param == "valkey-server":
        binary = valkey_binary()
        if binary is None:
            pytest.skip(HOW_TO_GET_VALKEY)
    with RedisServer(binary=binary) as server:
        yield server


@contextmanager
def stalled(server: RedisServer) -> Iterator[None]:
    """The server stopped (SIGSTOP) for the block: connections open, nothing answered."""
    assert server.pid is not None
    sigstop(server.pid)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


@pytest.fixture
def proxy(own_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", own_server.port)) as proxy:
        yield proxy


def _backend(url: str, path: str, namespace: str) -> RedisBackend:
    """A backend on ``url`` with a short timeout, on redis-py's default pool or a blocking one."""
    if path == "pool":
        return RedisBackend(url, timeout=_TIMEOUT, namespace=namespace)
    pool = redis.BlockingConnectionPool.from_url(
        url, socket_timeout=_TIMEOUT, socket_connect_timeout=_TIMEOUT
    )
    return RedisBackend(redis.Redis(connection_pool=pool), namespace=namespace)


# A script of the tests' own, so that these tests watch the connection, not the lock scripts.
_ECHO = "redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1]"
_calls = itertools.count()


def _roundtrip(backend: RedisBackend, key: str) -> None:
    """One script call through the backend's own path; its reply must be its own."""
    value = f"{key}:{next(_calls)}"
    reply = backend._eval(backend.client.register_script(_ECHO), 1, [f"heal:{key}", value])
    assert reply == value


def _open(backend: RedisBackend, key: str = "open") -> None:
    """A first call that must succeed before the fault under test: tried again while it times out.

    With a 0.3 s socket timeout a loaded machine (or a server just restarted by the test before)
    can make the first call time out, which is not what these tests are about.
    """
    deadline = time.monotonic() + 10
    while True:
        try:
            _roundtrip(backend, key)
            return
        except BackendError:
            if time.monotonic() > deadline:
                raise


def _fails_then_heals(backend: RedisBackend, fault: Callable[[], AbstractContextManager[object]]) -> None:
    """A call made during ``fault`` raises BackendError; the next call, once it is over, succeeds."""
    with fault(), pytest.raises(BackendError):
        _roundtrip(backend, "during")
    _roundtrip(backend, "after")
    _roundtrip(backend, "again")


_PATHS = pytest.mark.parametrize("path", ["pool", "blocking"])


@_PATHS
def test_a_first_call_during_a_stall_heals_once_the_server_answers(
    own_server: RedisServer, path: str
) -> None:
    # Bug 1 (of the kept connections this store once had): a thread's first call connected while
    # redis was stopped; every later call failed, even with redis back.
    backend = _backend(own_server.url, path, f"stall-first-{path}")
    _fails_then_heals(backend, lambda: stalled(own_server))


@_PATHS
def test_a_new_thread_whose_connect_stalls_heals(own_server: RedisServer, path: str) -> None:
    backend = _backend(own_server.url, path, f"stall-thread-{path}")
    _open(backend, "main thread")  # a connection is open; the worker's call may need another
    errors: list[BaseException] = []

    def work() -> None:
        try:
            _fails_then_heals(backend, lambda: stalled(own_server))
        except BaseException as exc:  # reported below
            errors.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join(30)
    assert errors == []
    _roundtrip(backend, "main thread again")


@_PATHS
def test_a_call_between_stalls_heals(own_server: RedisServer, path: str) -> None:
    backend = _backend(own_server.url, path, f"stall-between-{path}")
    _open(backend)  # connected and used: the stall comes between two calls
    _fails_then_heals(backend, lambda: stalled(own_server))


@_PATHS
def test_a_connect_through_a_paused_proxy_heals(proxy: FaultProxy, path: str) -> None:
    # The TCP connect succeeds; the handshake's replies never come.
    backend = _backend(proxy.url, path, f"paused-connect-{path}")
    _fails_then_heals(backend, lambda: _fault(proxy.pause, proxy.resume))


@_PATHS
def test_a_reply_lost_mid_call_never_reaches_the_next_call(proxy: FaultProxy, path: str) -> None:
    backend = _backend(proxy.url, path, f"held-{path}")
    _open(backend)
    echo = backend.client.register_script(_ECHO)
    proxy.hold_replies()
    with pytest.raises(BackendError, match="Timeout"):
        backend._eval(echo, 1, ["heal:held", "late"])  # applied on the server; its reply withheld
    proxy.resume()  # the late reply arrives on a connection that was given up
    _roundtrip(backend, "next")  # its own reply, not the late one
    assert backend.client.get("heal:held") == b"late"


@_PATHS
def test_an_interrupted_call_leaves_no_reply_behind(proxy: FaultProxy, path: str) -> None:
    # Interrupted (a signal handler raising, as Ctrl-C does) between sending and reading: its
    # reply, arriving later on a connection given up, must never be taken for the next call's.
    backend = _backend(proxy.url, path, f"interrupted-{path}")
    _open(backend)
    echo = backend.client.register_script(_ECHO)

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    proxy.hold_replies()
    try:
        signal.setitimer(signal.ITIMER_REAL, _TIMEOUT / 3)  # well before the socket timeout
        with pytest.raises(KeyboardInterrupt):
            backend._eval(echo, 1, ["heal:interrupted", "late"])  # applied; its reply withheld
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        proxy.resume()
    _roundtrip(backend, "next")  # its own reply, not the late one
    assert backend.client.get("heal:interrupted") == b"late"


@_PATHS
@pytest.mark.slow
def test_a_half_delivered_reply_heals(proxy: FaultProxy, path: str) -> None:
    backend = _backend(proxy.url, path, f"slow-{path}")
    _open(backend)
    proxy.delay(2 * _TIMEOUT)  # each reply arrives after the client gave up on it
    with pytest.raises(BackendError, match="Timeout"):
        _roundtrip(backend, "slow")
    proxy.delay(0)
    _roundtrip(backend, "after")


@_PATHS
def test_dropped_connections_heal(proxy: FaultProxy, path: str) -> None:
    backend = _backend(proxy.url, path, f"dropped-{path}")
    _open(backend)
    proxy.drop()  # between two calls: the next one sees the reset before it sends
    _roundtrip(backend, "after")
    assert proxy.connections == 1


@_PATHS
def test_a_server_restart_during_a_thread_s_first_call_heals(own_server: RedisServer, path: str) -> None:
    backend = _backend(own_server.url, path, f"restart-{path}")
    own_server.stop()
    try:
        with pytest.raises(BackendError):
            _roundtrip(backend, "down")
    finally:
        own_server.start()
    _roundtrip(backend, "back")


def test_a_forked_child_whose_first_connect_stalls_heals(proxy: FaultProxy) -> None:
    backend = _backend(proxy.url, "pool", "fork-stall")
    _roundtrip(backend, "parent")
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    proxy.pause()
    pid = os.fork()
    if pid == 0:  # the child: its own first connect stalls, then must heal
        code = 1
        try:
            try:
                _roundtrip(backend, "child during")
            except BackendError:
                os.write(ready_w, b"x")
                os.read(go_r, 1)
                _roundtrip(backend, "child after")
                code = 0
        finally:
            os._exit(code)
    try:
        assert os.read(ready_r, 1) == b"x"  # the child's call failed
    finally:
        proxy.resume()
        os.write(go_w, b"x")
        _, status = os.waitpid(pid, 0)
        for fd in (ready_r, ready_w, go_r, go_w):
            os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    _roundtrip(backend, "parent after")


@contextmanager
def _fault(begin: Callable[[], None], end: Callable[[], None]) -> Iterator[None]:
    begin()
    try:
        yield
    finally:
        end()
