"""The short way to Redis for the backend's script calls: a kept connection per thread.

Each thread keeps one connection of the client's own kind and settings (host,
TLS, auth, database, timeouts, retry policy), sends a command encoded by
:func:`pack` and reads its one reply straight off the socket
(:func:`_exchange`): our scripts answer with an integer or a string. Errors
and timeouts are raised as redis-py raises them, with the same classes. (Why
not ``execute_command``: docs/performance.md.)

Only a plain ``ConnectionPool`` of redis-py's own connection classes, speaking
RESP2, without health checks or client-side caching and not bounded below
redis-py's default of 100 connections, is used this way; any other client (a
blocking, bounded or Sentinel pool, a single-connection client, a connection
class of its own, RESP3) keeps the ordinary path. A connection is never shared by two threads, and
never used in a process other than the one that opened it (after ``fork`` the
child opens its own).

A kept connection heals as the pool's do: one that failed to open or to be
checked (a server down or stopped, a handshake that timed out) is left
closed, and one whose call failed (a timeout mid-reply, a reset) is closed,
so the next call on that thread opens a fresh one. Nothing a failed call
sent or half read is ever taken for the next call's reply.
"""

from __future__ import annotations

import os
import select
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import redis
from redis._parsers import _RESP2Parser

__all__ = ["Lanes", "evalsha_head", "pack", "pack_after"]

Arg = str | int | bytes


def pack(args: Sequence[Arg], encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """Encode one command as a RESP array of bulk strings (what redis-py sends for the same args)."""
    return b"*%d\r\n" % len(args) + _bulk(args, encoding, errors)


def _bulk(args: Sequence[Arg], encoding: str, errors: str) -> bytes:
    out = []
    for arg in args:
        if isinstance(arg, str):
            raw = arg.encode(encoding, errors)
        elif isinstance(arg, bytes):
            raw = arg
        elif isinstance(arg, int) and not isinstance(arg, bool):
            raw = b"%d" % arg
        else:
            # bool is refused as redis-py refuses it: True would silently become "1"
            raise TypeError(f"cannot send a {type(arg).__name__} to Redis: {arg!r}")
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def evalsha_head(sha: str | bytes, numkeys: int, nargs: int) -> bytes:
    """The fixed start of ``EVALSHA sha numkeys`` followed by ``nargs`` keys and arguments."""
    return b"*%d\r\n" % (3 + nargs) + _bulk(["EVALSHA", sha, numkeys], "ascii", "strict")


def _refuse(arg: object) -> str:
    raise TypeError(f"cannot send a {type(arg).__name__} to Redis: {arg!r}")


def pack_after(
    head: bytes, args: Sequence[str | int], encoding: str = "utf-8", errors: str = "strict"
) -> bytes:
    """``head`` (see :func:`evalsha_head`) followed by ``args`` as bulk strings."""
    if encoding in _ASCII_SUPERSETS:
        # Keys and arguments are nearly always ASCII: then a character is a byte,
        # and one format and one encode of the whole do what a loop per argument would.
        body = "".join([f"${len(a)}\r\n{a}\r\n" if type(a) is str else _int_bulk(a) for a in args])
        if body.isascii():
            return head + body.encode("ascii")
    return head + _bulk(args, encoding, errors)


def _int_bulk(arg: object) -> str:
    if type(arg) is not int:
        _refuse(arg)
    text = str(arg)
    return f"${len(text)}\r\n{text}\r\n"


# What execute_command retries (redis-py's Retry default): the call never reached a reply.
_RETRIED = (redis.ConnectionError, redis.TimeoutError, TimeoutError)

_OWN_CONNECTIONS = (redis.Connection, redis.SSLConnection, redis.UnixDomainSocketConnection)

# Encodings that write each ASCII character as that one byte.
_ASCII_SUPERSETS = frozenset({"utf-8", "utf8", "UTF-8", "latin-1", "latin1", "ascii"})


# What a lane's ``sock`` is until its connection is open and checked: no socket
# (``conn._sock`` is a socket or None) is ever this, so every call goes the long way.
_UNREADY: Any = object()


class _Lane:
    """One thread's connection, its socket and a poller that watches it.

    ``sock`` is the socket ``poller`` watches, and only ever one that was
    opened and checked in full; otherwise it is ``_UNREADY``, so that a failed
    connect or check leaves nothing a later call could trust.
    """

    __slots__ = ("conn", "pid", "poller", "sock")

    def __init__(self, conn: Any, pid: int) -> None:
        self.conn = conn
        self.pid = pid
        self.sock: Any = _UNREADY
        self.poller: Any = None


class Lanes:
    """One connection per thread of a redis-py client, kept open between calls."""

    def __init__(self, client: redis.Redis) -> None:
        pool = client.connection_pool
        self._pool = pool
        kwargs = pool.connection_kwargs
        self.encoding: str = kwargs.get("encoding", "utf-8")
        self.errors: str = kwargs.get("encoding_errors", "strict")
        self._local = threading.local()
        self._open: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    @staticmethod
    def fit(client: redis.Redis) -> bool:
        """True if ``client``'s connections can be kept this way without changing what it does."""
        pool = getattr(client, "connection_pool", None)
        return (
            hasattr(select, "poll")
            and type(pool) is redis.ConnectionPool
            # redis-py's own sockets: a subclass (a test double, a proxy) may have none to poll
            and pool.connection_class in _OWN_CONNECTIONS
            and getattr(pool, "cache", None) is None  # client-side caching wraps its connections
            and getattr(client, "connection", None) is None  # single_connection_client
            # A pool bounded below redis-py's default means its owner counts connections.
            and pool.max_connections >= 100
            # RESP2, whose replies to our scripts are all this module reads; RESP3 may
            # send pushes (maintenance notices) between them, which redis-py's parser handles.
            and pool.connection_kwargs.get("protocol") in (None, 2, "2")
            # Health checks are redis-py's, made when it sends: the poll before each call does their work.
            and not pool.connection_kwargs.get("health_check_interval")
        )

    def _lane(self) -> _Lane:
        """This thread's lane, its connection open and checked as the pool checks one it hands out."""
        lane: _Lane | None = getattr(self._local, "lane", None)
        pid = os.getpid()
        if lane is None or lane.pid != pid:
            # A new thread, or a forked child: the parent's socket is not ours to use.
            # The same class and arguments as the pool's own connections.
            conn = self._pool.connection_class(**self._pool.connection_kwargs)
            with self._lock:
                self._open.add(conn)
            lane = self._local.lane = _Lane(conn, pid)
        conn = lane.conn
        sock = conn._sock  # private, but the same in every redis-py this package supports (>= 5)
        # Between two calls nothing should arrive: anything readable is the
        # server closing the connection (a restart, an idle timeout) or a
        # reply we do not expect; the pool would not hand out either.
        if sock is not None and sock is lane.sock and not lane.poller.poll(0):
            return lane
        # Until the connection is open and checked again, the lane is unready: should
        # what follows fail (a server that is down or stalled), the next call starts afresh.
        lane.sock = _UNREADY
        try:
            if sock is None:
                conn.connect()
            else:
                self._check(conn)
        except BaseException:
            # A connect cut short (a timeout in the handshake, an interrupt) may leave a
            # socket with a reply pending on it: never let a later call read it.
            conn.disconnect()
            raise
        sock = conn._sock
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        lane.poller, lane.sock = poller, sock
        return lane

    def _check(self, conn: Any) -> None:
        # ConnectionPool.get_connection's test, on the rare call that needs it.
        maint = getattr(self._pool, "maint_notifications_enabled", lambda: False)
        try:
            if conn.can_read() and not maint():
                raise redis.ConnectionError("Connection has data")
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            conn.disconnect()
            conn.connect()
            if conn.can_read() and not maint():
                raise redis.ConnectionError("Connection not ready") from None

    def call(self, command: bytes) -> Any:
        """Send a packed command on this thread's connection and return its reply.

        The reply is read here, not by redis-py's parser: an integer as an
        int, a string as bytes (whatever ``decode_responses`` says), an error
        reply raised as redis-py raises it (``NoScriptError``, ``ResponseError``,
        ...). As through the pool: a failure to connect is raised at once, and a
        connection error or timeout of the call itself is retried by the
        client's retry policy.
        """
        lane: _Lane | None = getattr(self._local, "lane", None)
        # The usual call, in line: this thread's lane, its socket unchanged and quiet (see _lane).
        if lane is None or lane.pid != os.getpid() or lane.conn._sock is not lane.sock or lane.poller.poll(0):
            lane = self._lane()
        conn = lane.conn
        try:
            try:
                return _exchange(lane.sock, command)
            except _RETRIED as exc:
                conn.disconnect()
                return self._retry(conn, command, exc)
        except redis.ResponseError:
            raise  # an error reply leaves the connection in step
        except BaseException:
            # Anything else, on the first try or a retry (a reply not read, an
            # interrupt between sending and reading, a timeout the retry policy
            # does not take) would hand this call's reply to the next: start afresh.
            conn.disconnect()
            raise

    @staticmethod
    def _retry(conn: Any, command: bytes, first: Exception) -> Any:
        # The first failure counts as the policy's first attempt, so a call is
        # tried no more often, and waits no longer, than through the pool.
        pending = [first]

        def attempt() -> Any:
            if pending:
                raise pending.pop()
            if conn._sock is None:
                conn.connect()
            return _exchange(conn._sock, command)

        return conn.retry.call_with_retry(attempt, lambda _error: conn.disconnect())

    def close(self) -> None:
        """Close every kept connection (a later call opens a new one)."""
        with self._lock:
            conns = list(self._open)
        for conn in conns:
            conn.disconnect()


_CHUNK = 65536
_INTEGER, _STRING, _ERROR, _STATUS = 58, 36, 45, 43  # ":", "$", "-", "+"


def _exchange(sock: Any, command: bytes) -> Any:
    """Send ``command`` on ``sock`` and read its one reply: an integer, a string, a status or an error.

    Socket failures become redis-py's own ``TimeoutError`` / ``ConnectionError``,
    and an error reply the ``ResponseError`` redis-py would raise for it; a
    reply of any other type, or more than one, is an ``InvalidResponse``.
    """
    try:
        sock.sendall(command)
        data = _more(sock)
        while True:
            end = data.find(b"\r\n")
            if end == 0:
                raise redis.InvalidResponse("a reply with no type")
            if end > 0:
                kind = data[0]
                if kind == _STRING:
                    length = int(data[1:end])
                    size = end + 2 if length < 0 else end + length + 4
                elif kind in (_INTEGER, _ERROR, _STATUS):
                    size = end + 2
                else:
                    raise redis.InvalidResponse(f"unexpected reply type {chr(kind)!r}")
                if len(data) >= size:
                    break
            data += _more(sock)
        if len(data) > size:
            raise redis.InvalidResponse("more than one reply to one command")
        if kind == _INTEGER:
            return int(data[1:end])
        if kind == _STRING:
            return data[end + 2 : -2] if length >= 0 else None
        if kind == _STATUS:
            return data[1:end]
    except TimeoutError as exc:  # socket.timeout
        raise redis.TimeoutError("Timeout reading from socket") from exc
    except OSError as exc:
        raise redis.ConnectionError(f"Error while talking to the server: {exc}") from exc
    except ValueError as exc:  # a length or an integer that is not one
        raise redis.InvalidResponse(f"bad reply {data[:40]!r}") from exc
    raise _RESP2Parser.parse_error(data[1:end].decode("utf-8", "replace"))  # type: ignore[no-untyped-call]


def _more(sock: Any) -> bytes:
    chunk: bytes = sock.recv(_CHUNK)
    if not chunk:
        raise redis.ConnectionError("Connection closed by server.")
    return chunk
