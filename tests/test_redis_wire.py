"""The Redis backend's short path: its command encoder and the connection each thread keeps.

Every test that takes a server runs against the session's redis-server and
again against its valkey-server (``redis_server`` and ``own_server`` below).
"""

from __future__ import annotations

import gc
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
from hypothesis import given
from hypothesis import strategies as st
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
from uniqjob.stores.redis import RedisBackend, _transport
from uniqjob.stores.redis._transport import evalsha_head, pack, pack_after

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


_args = st.lists(st.one_of(st.text(), st.integers(), st.binary()), max_size=12)
# (texts of about 1,024 characters too: pack_after looks lengths below that up in a table)
_texts = st.lists(st.one_of(st.text(), st.integers(), st.text(min_size=1020, max_size=1030)), max_size=12)


@given(_args)
def test_pack_sends_what_redis_py_sends(args: list[str | int | bytes]) -> None:
    packed = redis.Connection().pack_command("EVALSHA", *args)  # type: ignore[no-untyped-call]
    assert pack(["EVALSHA", *args]) == b"".join(packed)


@given(_texts, st.integers(0, 3))
def test_pack_after_a_head_is_the_whole_command(args: list[str | int], numkeys: int) -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    whole = pack(["EVALSHA", sha, numkeys, *args])
    assert pack_after(evalsha_head(sha, numkeys, len(args)), args) == whole
    # an encoding that is not ASCII's superset takes the general road
    head = evalsha_head(sha, numkeys, len(args))
    body = pack_after(head, args, "utf-16")[len(head) :]
    assert b"*%d\r\n" % len(args) + body == pack(args, "utf-16")


@pytest.mark.parametrize("bad", [True, 1.5, None, object()])
def test_pack_refuses_what_redis_py_refuses(bad: Any) -> None:
    with pytest.raises(TypeError, match="cannot send a"):
        pack(["GET", bad])
    with pytest.raises(TypeError, match="cannot send a"):
        pack_after(b"", ["k", bad])


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


def test_close_closes_every_kept_connection(redis_server: RedisServer, redis_client: redis.Redis) -> None:
    name = "uniqjob-close-test"
    _cycle(RedisBackend(redis_client, namespace="warm"), "k")  # scripts loaded: no pooled SCRIPT LOAD below
    backend = RedisBackend(redis.Redis.from_url(redis_server.url, client_name=name), namespace="close")
    used, done = threading.Event(), threading.Event()

    def work() -> None:
        _cycle(backend, "in-thread")
        used.set()
        done.wait(30)  # alive, so its connection is still kept

    def mine() -> int:
        return sum(1 for c in redis_client.client_list() if c.get("name") == name)

    worker = threading.Thread(target=work)
    worker.start()
    try:
        assert used.wait(30)
        _cycle(backend, "here")
        assert mine() == 2  # this thread's and the other's
        backend.close()
        wait_until(lambda: mine() == 0, "the server to see both connections closed", timeout=10)
        _cycle(backend, "after")  # closed is not broken: the next call connects again
        assert mine() == 1
    finally:
        done.set()
        worker.join(30)


@pytest.mark.slow
def test_a_thread_that_ends_leaves_no_connection(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    name = "uniqjob-thread-end-test"
    _cycle(RedisBackend(redis_client, namespace="warm"), "k")  # scripts loaded: no pooled SCRIPT LOAD below
    backend = RedisBackend(redis.Redis.from_url(redis_server.url, client_name=name), namespace="ends")
    workers = [threading.Thread(target=_cycle, args=(backend, f"k{n}")) for n in range(3)]
    for worker in workers:
        worker.start()
        worker.join(30)
    gc.collect()

    def mine() -> int:
        return sum(1 for c in redis_client.client_list() if c.get("name") == name)

    wait_until(lambda: mine() == 0, "the ended threads' connections to close", timeout=10)


class _OwnConnection(redis.Connection):
    """A connection class of the caller's own: redis-py's path is left to it."""


@pytest.mark.parametrize("kind", ["blocking pool", "bounded pool", "single connection", "own class"])
def test_other_clients_work_through_redis_py(redis_server: RedisServer, kind: str) -> None:
    # Their bound on connections is kept: no connection of our own.
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
    assert backend._lanes is None
    _cycle(backend, "k")
    client.script_flush()  # NOSCRIPT is survived on this path too
    _cycle(backend, "é")


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("decode", [False, True])
def test_either_protocol_and_decoding(redis_server: RedisServer, protocol: int, decode: bool) -> None:
    client = redis.Redis.from_url(redis_server.url, protocol=protocol, decode_responses=decode)
    backend = RedisBackend(client, namespace=f"p{protocol}{decode:d}")
    # RESP3 may interleave pushes with replies: redis-py's own parser reads them.
    assert (backend._lanes is not None) == (protocol == 2)
    _cycle(backend, "k:é")
    assert backend.claim("k:é", "t", meta=QueueMeta("c", "ä")) is None
    state = backend.claim("k:é", "u", meta=QueueMeta())
    assert state is not None and state.queue is not None and state.queue.meta.args == "ä"


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


@pytest.mark.parametrize("path", ["kept", "pooled"])
@pytest.mark.slow
def test_retries_are_the_clients_own_policy(redis_server: RedisServer, path: str) -> None:
    def client(**kwargs: Any) -> redis.Redis:
        retry = Retry(_CountingBackoff(), 2)
        if path == "kept":
            return redis.Redis(retry=retry, **kwargs)
        pool = redis.BlockingConnectionPool(retry=retry, **kwargs)  # type: ignore[no-untyped-call]
        return redis.Redis(connection_pool=pool)

    # A server that refuses: the connection is tried as the pool tries it, no more.
    closed = _closed_port()
    own = _backoffs(lambda: client(host="127.0.0.1", port=closed).ping(), redis.ConnectionError)
    assert own == (2 if _REDIS_PY >= (6,) else 0)  # redis-py 5 connects outside its retry
    _CountingBackoff.failures = 0
    refused = RedisBackend(client(host="127.0.0.1", port=closed))
    assert (refused._lanes is not None) == (path == "kept")
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
    busy = _busy_script(redis_server, seconds=timeout * 4)  # ample: only longer than a timeout matters
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


def test_a_unix_socket_takes_the_short_path_too(redis_server: RedisServer) -> None:
    backend = RedisBackend(redis_server.unix_url, namespace="unix")
    assert backend._lanes is not None
    _cycle(backend, "k")
    backend.close()


def test_a_client_with_health_checks_keeps_redis_py_s_path(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url, health_check_interval=5)
    backend = RedisBackend(client, namespace="health")
    assert backend._lanes is None
    _cycle(backend, "k")


def test_a_retry_that_fails_otherwise_leaves_no_reply_behind(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first try fails as the retry policy expects; the retry is interrupted
    # between sending and reading: its reply must never be taken for the next call's.
    # (retry_on_error: redis-py 5 retries only those; from 6 on the Retry's own errors are retried)
    client = redis.Redis.from_url(
        redis_server.url, retry=Retry(NoBackoff(), 1), retry_on_error=[redis.ConnectionError]
    )
    backend = RedisBackend(client, namespace="interrupted")
    _cycle(backend, "warm")
    lanes = backend._lanes
    assert lanes is not None
    real = _transport._exchange
    calls: list[bytes] = []

    def flaky(sock: Any, command: bytes) -> Any:
        calls.append(command)
        if len(calls) == 1:
            raise redis.ConnectionError("dropped")
        sock.sendall(command)  # sent, then interrupted before its reply is read
        raise KeyboardInterrupt

    monkeypatch.setattr(_transport, "_exchange", flaky)
    with pytest.raises(KeyboardInterrupt):
        backend.claim("k", "t", meta=QueueMeta())
    monkeypatch.setattr(_transport, "_exchange", real)
    assert len(calls) == 2
    assert lanes._lane().conn._sock is not None  # a new connection, nothing pending on it
    assert backend.claim("other", "u", meta=QueueMeta()) is None  # its own reply, not the stale one
    state = backend.claim("k", "v", meta=QueueMeta())  # the interrupted claim did reach the server
    assert state is not None and state.queue is not None and state.queue.token == "t"


class _Replies:
    """A socket stand-in: takes what is sent, answers with the given chunks, then end of stream."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)
        self.sent = b""

    def sendall(self, data: bytes) -> None:
        self.sent += data

    def recv(self, size: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ((b":1\r\n",), 1),
        ((b":-42\r\n",), -42),
        ((b"$5\r\nhello\r\n",), b"hello"),
        ((b"$6\r\na\r\nb\r\n\r\n",), b"a\r\nb\r\n"),  # a string holding the line ending
        ((b"$", b"11", b"\r\nhello", b" world", b"\r", b"\n"), b"hello world"),  # split anywhere
        ((b"$0\r\n\r\n",), b""),
        ((b"$-1\r\n",), None),
        ((b"+PONG\r\n",), b"PONG"),
        # arrays, as the semaphore scripts reply: nested, with nil, split anywhere
        ((b"*0\r\n",), []),
        ((b"*-1\r\n",), None),
        ((b"*3\r\n$2\r\nok\r\n*1\r\n*2\r\n:7\r\n$-1\r\n:-3\r\n",), [b"ok", [[7, None]], -3]),
        ((b"*2\r\n$5\r\nhel", b"lo\r\n*1", b"\r\n+x\r", b"\n"), [b"hello", [b"x"]]),
        ((b"*1\r\n$70000\r\n" + b"a" * 60000, b"a" * 10000 + b"\r\n"), [b"a" * 70000]),
    ],
)
def test_the_reader_takes_one_whole_reply(chunks: tuple[bytes, ...], expected: Any) -> None:
    sock = _Replies(*chunks)
    assert _transport._exchange(sock, b"*1\r\n$4\r\nPING\r\n") == expected
    assert sock.sent == b"*1\r\n$4\r\nPING\r\n" and sock.chunks == []


@pytest.mark.parametrize(
    ("chunks", "error", "match"),
    [
        ((b"-NOSCRIPT No matching script.\r\n",), redis.exceptions.NoScriptError, "No matching script"),
        ((b"-ERR wrong\r\n",), redis.ResponseError, "wrong"),
        ((b"%1\r\n:1\r\n:1\r\n",), redis.InvalidResponse, "unexpected reply type"),
        ((b"*1\r\n-ERR inside\r\n",), redis.InvalidResponse, "unexpected reply type"),
        ((b"*1\r\n:1\r\n:2\r\n",), redis.InvalidResponse, "more than one reply"),
        ((b"*1\r\n\r\n",), redis.InvalidResponse, "no type"),
        ((b"*x\r\n",), redis.InvalidResponse, "bad reply"),
        ((b"*2\r\n:1\r\n",), redis.ConnectionError, "closed by server"),
        ((b":1\r\n:2\r\n",), redis.InvalidResponse, "more than one reply"),
        ((b"\r\n",), redis.InvalidResponse, "no type"),
        ((b":x\r\n",), redis.InvalidResponse, "bad reply"),
        ((b"$x\r\n",), redis.InvalidResponse, "bad reply"),
        ((b"$5\r\nhel",), redis.ConnectionError, "closed by server"),
        ((), redis.ConnectionError, "closed by server"),
    ],
)
def test_the_reader_names_what_is_wrong(
    chunks: tuple[bytes, ...], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        _transport._exchange(_Replies(*chunks), b"*1\r\n$4\r\nPING\r\n")


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
    """A backend on ``url`` with a short timeout, on the kept lanes or redis-py's own pool."""
    if path == "kept":
        backend = RedisBackend(url, timeout=_TIMEOUT, namespace=namespace)
        assert backend._lanes is not None
        return backend
    pool = redis.BlockingConnectionPool.from_url(
        url, socket_timeout=_TIMEOUT, socket_connect_timeout=_TIMEOUT
    )
    backend = RedisBackend(redis.Redis(connection_pool=pool), namespace=namespace)
    assert backend._lanes is None
    return backend


# A script of the tests' own, so that these tests watch the connection, not the lock scripts.
_ECHO = "redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1]"
_calls = itertools.count()


def _roundtrip(backend: RedisBackend, key: str) -> None:
    """One script call through the backend's own path; its reply must be its own."""
    value = f"{key}:{next(_calls)}"
    reply = backend._eval(backend._script(_ECHO), 1, [f"heal:{key}", value])
    assert reply == value.encode()


def _fails_then_heals(backend: RedisBackend, fault: Callable[[], AbstractContextManager[object]]) -> None:
    """A call made during ``fault`` raises BackendError; the next call, once it is over, succeeds."""
    with fault(), pytest.raises(BackendError):
        _roundtrip(backend, "during")
    _roundtrip(backend, "after")
    _roundtrip(backend, "again")


_PATHS = pytest.mark.parametrize("path", ["kept", "pooled"])


@_PATHS
def test_a_first_call_during_a_stall_heals_once_the_server_answers(
    own_server: RedisServer, path: str
) -> None:
    # Bug 1: a thread's first call connected while redis was stopped; every later call
    # failed with "'NoneType' object has no attribute 'poll'", even with redis back.
    backend = _backend(own_server.url, path, f"stall-first-{path}")
    _fails_then_heals(backend, lambda: stalled(own_server))


@_PATHS
def test_a_new_thread_whose_connect_stalls_heals(own_server: RedisServer, path: str) -> None:
    backend = _backend(own_server.url, path, f"stall-thread-{path}")
    _roundtrip(backend, "main thread")  # the main thread's lane is open; the worker's is not
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
    _roundtrip(backend, "open")  # connected and used: the stall comes between two calls
    _fails_then_heals(backend, lambda: stalled(own_server))


@_PATHS
def test_a_connect_through_a_paused_proxy_heals(proxy: FaultProxy, path: str) -> None:
    # The TCP connect succeeds; the handshake's replies never come.
    backend = _backend(proxy.url, path, f"paused-connect-{path}")
    _fails_then_heals(backend, lambda: _fault(proxy.pause, proxy.resume))


@_PATHS
def test_a_reply_lost_mid_call_never_reaches_the_next_call(proxy: FaultProxy, path: str) -> None:
    backend = _backend(proxy.url, path, f"held-{path}")
    _roundtrip(backend, "open")
    echo = backend._script(_ECHO)
    proxy.hold_replies()
    with pytest.raises(BackendError, match="Timeout"):
        backend._eval(echo, 1, ["heal:held", "late"])  # applied on the server; its reply withheld
    proxy.resume()  # the late reply arrives on a connection that was given up
    _roundtrip(backend, "next")  # its own reply, not the late one
    assert backend.client.get("heal:held") == b"late"


@_PATHS
@pytest.mark.slow
def test_a_half_delivered_reply_heals(proxy: FaultProxy, path: str) -> None:
    backend = _backend(proxy.url, path, f"slow-{path}")
    _roundtrip(backend, "open")
    proxy.delay(2 * _TIMEOUT)  # each reply arrives after the client gave up on it
    with pytest.raises(BackendError, match="Timeout"):
        _roundtrip(backend, "slow")
    proxy.delay(0)
    _roundtrip(backend, "after")


@_PATHS
def test_dropped_connections_heal(proxy: FaultProxy, path: str) -> None:
    backend = _backend(proxy.url, path, f"dropped-{path}")
    _roundtrip(backend, "open")
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
    backend = _backend(proxy.url, "kept", "fork-stall")
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
