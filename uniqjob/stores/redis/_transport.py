"""How the Redis stores call their scripts (:class:`Scripts`); the short way, a kept connection per thread.

Both the lock store and the semaphore store call their Lua through
:class:`Scripts`: ``EVALSHA`` on this thread's kept connection (:class:`Lanes`)
when the client fits, else through the client itself, and the script loaded
again if the server lost it (``NOSCRIPT``).

Each thread keeps one connection of the client's own kind and settings (host,
TLS, auth, database, timeouts, retry policy), sends a command encoded by
:func:`pack` and reads its one reply straight off the socket
(:func:`_exchange`): the lock scripts answer with an integer or a string, read
in line; the semaphore scripts with arrays (of integers, strings, nil and
arrays), read by :func:`_array`. Errors and timeouts are raised as redis-py
raises them, with the same classes. (Why not ``execute_command``:
docs/performance.md.) A batch of calls (:meth:`Scripts.many`, the listings'
reads) goes in one write, its replies read in one pass (:func:`_replies`).

Only a plain ``ConnectionPool`` of redis-py's own connection classes, speaking
RESP2, without health checks or client-side caching and not bounded below
redis-py's default of 100 connections, is used this way; any other client (a
blocking, bounded or Sentinel pool, a single-connection client, a connection
class of its own, RESP3, a client class that sends scripts its own way) keeps the ordinary
path. A connection is never shared by two threads, and
never used in a process other than the one that opened it (after ``fork`` the
child opens its own).

A kept connection heals as the pool's do: one that failed to open or to be
checked (a server down or stopped, a handshake that timed out) is left
closed, and one whose call failed (a timeout mid-reply, a reset) is closed,
so the next call on that thread opens a fresh one. Nothing a failed call
sent or half read is ever taken for the next call's reply.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import redis
from redis._parsers import _RESP2Parser
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from ._client import _classes

#: redis-py 5 retries a call only on the errors of the connection's ``retry_on_error``
#: (its ``Redis._disconnect_raise``), whatever its Retry supports; from 6 on, the Retry decides.
_RETRY_ON_ERROR_ONLY = int(redis.__version__.split(".")[0]) < 6

__all__ = ["Lanes", "Scripts", "evalsha_head", "is_noscript", "pack", "pack_after"]

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


def pack_after(
    head: bytes, args: Sequence[str | int], encoding: str = "utf-8", errors: str = "strict"
) -> bytes:
    """``head`` (see :func:`evalsha_head`) followed by ``args`` as bulk strings."""
    if args and encoding in _ASCII_SUPERSETS:
        # Keys and arguments are nearly always ASCII text of a few hundred characters at most:
        # then a character is a byte, each length's "$<n>\r\n" is looked up, not formatted, and
        # one join and one encode of the whole do what a format per argument would (0.6x the
        # instructions). A list with an int or a longer text is formatted argument by argument;
        # bytes, and what Redis cannot take, go _bulk's way (it refuses what redis-py refuses).
        try:
            try:
                lengths = _LENGTHS
                body = "\r\n".join([lengths[len(a)] + a for a in args])  # type: ignore[arg-type,operator]
            except (TypeError, IndexError):
                body = "\r\n".join([_text_bulk(a) for a in args])
        except TypeError:
            pass
        else:
            if body.isascii():
                return head + body.encode("ascii") + b"\r\n"
    return head + _bulk(args, encoding, errors)


def _text_bulk(arg: object) -> str:
    """``arg`` as a bulk string without its last CRLF, if it is a text or an int; else TypeError."""
    if type(arg) is str:
        return f"${len(arg)}\r\n{arg}"
    if type(arg) is int:
        text = str(arg)
        return f"${len(text)}\r\n{text}"
    raise TypeError(arg)


#: The start of a bulk string of each length up to 1023 (pack_after's table).
_LENGTHS = [f"${n}\r\n" for n in range(1024)]


# What execute_command retries (redis-py's Retry default): the call never reached a reply.
_RETRIED = (redis.ConnectionError, redis.TimeoutError, TimeoutError)

_OWN_CONNECTIONS = (redis.Connection, redis.SSLConnection, redis.UnixDomainSocketConnection)

# Encodings that write each ASCII character as that one byte.
_ASCII_SUPERSETS = frozenset({"utf-8", "utf8", "UTF-8", "latin-1", "latin1", "ascii"})


# This process's id, kept up to date by a fork hook: os.getpid() is a system call on every
# call, and a lane opened before a fork must never be used in the child.
_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


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
            # A client class that sends scripts its own way (instrumentation, a stand-in) is called.
            and type(client).evalsha is redis.Redis.evalsha
            and type(client).execute_command is redis.Redis.execute_command
        )

    def _lane(self) -> _Lane:
        """This thread's lane, its connection open and checked as the pool checks one it hands out."""
        lane: _Lane | None = getattr(self._local, "lane", None)
        pid = _pid
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

    def call(self, command: bytes, exchange: Callable[[Any, bytes], Any] | None = None) -> Any:
        """Send a packed command on this thread's connection and return its reply.

        The reply is read here, not by redis-py's parser: an integer as an
        int, a string as bytes (whatever ``decode_responses`` says), an error
        reply raised as redis-py raises it (``NoScriptError``, ``ResponseError``,
        ...). As through the pool: a failure to connect is raised at once, and a
        connection error or timeout of the call itself is retried by the
        client's retry policy. ``exchange`` sends and reads (:func:`_exchange`: one
        reply; :func:`_exchange_pair`: the two replies of two commands sent together).
        """
        lane: _Lane | None = getattr(self._local, "lane", None)
        # The usual call, in line: this thread's lane, its socket unchanged and quiet (see _lane).
        if lane is None or lane.pid != _pid or lane.conn._sock is not lane.sock or lane.poller.poll(0):
            lane = self._lane()
        conn = lane.conn
        if exchange is None:
            exchange = _exchange
        try:
            try:
                return exchange(lane.sock, command)
            except _RETRIED as exc:
                conn.disconnect()
                return self._retry(conn, command, exc, exchange)
        except redis.ResponseError:
            raise  # an error reply leaves the connection in step
        except BaseException:
            # Anything else, on the first try or a retry (a reply not read, an
            # interrupt between sending and reading, a timeout the retry policy
            # does not take) would hand this call's reply to the next: start afresh.
            conn.disconnect()
            raise

    @staticmethod
    def _retry(conn: Any, command: bytes, first: Exception, exchange: Callable[[Any, bytes], Any]) -> Any:
        # The first failure counts as the policy's first attempt, so a call is
        # tried no more often, and waits no longer, than through the pool.
        pending = [first]

        def attempt() -> Any:
            if pending:
                raise pending.pop()
            if conn._sock is None:
                conn.connect()
            return exchange(conn._sock, command)

        def failed(error: Exception) -> None:
            conn.disconnect()
            if _RETRY_ON_ERROR_ONLY and not isinstance(error, tuple(conn.retry_on_error or ())):
                raise error

        return conn.retry.call_with_retry(attempt, failed)

    def close(self) -> None:
        """Close every kept connection (a later call opens a new one)."""
        with self._lock:
            conns = list(self._open)
        for conn in conns:
            conn.disconnect()


class Scripts:
    """How a store calls its Lua scripts on ``client``: see the module's docstring.

    ``lanes``: kept connections to share (another store's on the same client);
    by default the client's own if it fits (:meth:`Lanes.fit`), else none.
    """

    def __init__(self, client: Any, lanes: Lanes | None = None) -> None:
        self.client = client
        if lanes is None and Lanes.fit(client):
            lanes = Lanes(client)
        self.lanes = lanes
        self._heads: dict[tuple[Any, int, int], bytes] = {}

    def call(self, script: Script, numkeys: int, items: Sequence[Any]) -> Any:
        """Run ``script`` with ``items``, its ``numkeys`` keys and then its arguments; its reply."""
        lanes = self.lanes
        if lanes is None:
            return self._pooled(script, numkeys, items)
        head = self._heads.get((script.sha, numkeys, len(items))) or self._head(script, numkeys, len(items))
        try:
            return lanes.call(pack_after(head, items, lanes.encoding, lanes.errors))
        except NoScriptError:  # the server lost its script cache (restart, SCRIPT FLUSH)
            script.sha = self.client.script_load(script.script)
            head = self._head(script, numkeys, len(items))
            return lanes.call(pack_after(head, items, lanes.encoding, lanes.errors))

    def many(self, script: Script, numkeys: int, batch: Sequence[Sequence[Any]]) -> list[Any]:
        """Run ``script`` once for each entry of ``batch`` (its keys, then its arguments), all sent together.

        The replies come in ``batch``'s order, an error reply in its place as
        the ``ResponseError`` redis-py makes of it (returned, not raised); a
        failure to talk to the server is raised. On this thread's kept
        connection the commands go in one write and their replies are read in
        one pass; otherwise through the client's ``pipeline(transaction=False)``,
        which on a cluster client sends each call to the node of its keys' slot.
        If the server lost the script (``NOSCRIPT``), it is loaded and the batch sent again.
        """
        for attempt in (0, 1):
            replies = self._batch(script, numkeys, batch)
            if attempt or not any(isinstance(reply, Exception) and is_noscript(reply) for reply in replies):
                return replies
            script.sha = self.client.script_load(script.script)
        raise AssertionError("unreachable")  # pragma: no cover

    def _batch(self, script: Script, numkeys: int, batch: Sequence[Sequence[Any]]) -> list[Any]:
        if not batch:
            return []
        lanes = self.lanes
        if lanes is None:
            pipe = self.client.pipeline(transaction=False)
            for items in batch:  # (a cluster pipeline refuses its evalsha method, not the command)
                pipe.execute_command("EVALSHA", script.sha, numkeys, *items)
            return list(pipe.execute(raise_on_error=False))
        commands = b"".join(
            pack_after(
                self._heads.get((script.sha, numkeys, len(items))) or self._head(script, numkeys, len(items)),
                items,
                lanes.encoding,
                lanes.errors,
            )
            for items in batch
        )
        return lanes.call(commands, partial(_replies, count=len(batch)))  # type: ignore[no-any-return]

    def _head(self, script: Script, numkeys: int, count: int) -> bytes:
        head = self._heads[(script.sha, numkeys, count)] = evalsha_head(script.sha, numkeys, count)
        return head

    def _pooled(self, script: Script, numkeys: int, items: Sequence[Any]) -> Any:
        # EVALSHA through the client's evalsha: Script.__call__ costs as much
        # again in Python (an import, tuple copies, two more layers) on every call.
        try:
            return self.client.evalsha(script.sha, numkeys, *items)
        except Exception as exc:
            if not is_noscript(exc):
                raise
            script.sha = self.client.script_load(script.script)
            return self.client.evalsha(script.sha, numkeys, *items)

    def acked(
        self, script: Script, numkeys: int, items: Sequence[Any], wait: tuple[int, int]
    ) -> tuple[Any, int | Exception]:
        """Run ``script`` as :meth:`call` does, then ``WAIT replicas timeout_ms`` (``wait``) on the same
        connection, both sent in one round trip; the script's reply and how many replicas acknowledged
        (or the error ``WAIT`` replied: a master that became a replica, say).

        ``WAIT`` counts the writes of its own connection, so it goes where the script went: this
        thread's kept connection, one connection of the client's pool (a pipeline), or on a
        cluster client the connection to the primary that owns the first key's slot (its slot
        map refreshed and the call sent again once, should that node redirect it).
        """
        lanes = self.lanes
        if lanes is not None:
            tail = pack(["WAIT", *wait])
            for attempt in (0, 1):
                head = self._heads.get((script.sha, numkeys, len(items))) or self._head(
                    script, numkeys, len(items)
                )
                command = pack_after(head, items, lanes.encoding, lanes.errors) + tail
                try:
                    replies: tuple[Any, int | Exception] = lanes.call(command, _exchange_pair)
                except NoScriptError:  # as in call(): the server lost its scripts
                    if attempt:
                        raise
                    script.sha = self.client.script_load(script.script)
                    continue
                return replies
        if not callable(getattr(self.client, "get_node_from_key", None)):
            return _piped(self.client, script, numkeys, items, wait)
        return self._on_owner(script, numkeys, items, wait)

    def _on_owner(
        self, script: Script, numkeys: int, items: Sequence[Any], wait: tuple[int, int]
    ) -> tuple[Any, int | Exception]:
        """:func:`_piped` on the cluster primary that owns ``items[0]``'s slot; one redirect followed.

        Works with redis-py's ``RedisCluster`` and valkey-py's ``ValkeyCluster`` (each node's
        client, and the redirect errors, are the library's own). A node that cannot be reached
        (a master killed, say) makes the client read the slot map again before the error is
        raised, so the next call goes to whichever node owns the slot then.
        """
        cluster = self.client
        node = cluster.get_node_from_key(items[0])
        try:
            return _piped(_node_client(node), script, numkeys, items, wait)
        except _classes("AskError") as exc:  # MovedError too: the slot map this client holds is out of date
            if isinstance(exc, _classes("MovedError")):
                cluster.nodes_manager.initialize()
                node = cluster.get_node_from_key(items[0])
                return _piped(_node_client(node), script, numkeys, items, wait)
            # ASK: the slot is moving and the key is not on this node: ask the one it names (ASKING first)
            target = cluster.get_node(host=exc.host, port=exc.port)  # type: ignore[attr-defined]
            if target is None:
                raise
            return _piped(_node_client(target), script, numkeys, items, wait, asking=True)
        except _classes("ConnectionError") + _classes("TimeoutError") + (OSError,):
            _refresh(cluster)
            raise

    def connected_replicas(self, name: Any) -> int | None:
        """How many replicas the primary that holds ``name`` has connected (``INFO replication``).

        On one server (or a Sentinel master) the client's own; on a cluster, that of the
        node that owns ``name``'s slot. None if it cannot be told: this never raises.
        """
        try:
            client = self.client
            if callable(getattr(client, "get_node_from_key", None)):
                client = _node_client(client.get_node_from_key(name))
            info = client.info("replication")
            return int(info["connected_slaves"])
        except Exception:  # only for a message: the call fails with its own error
            return None

    def close(self) -> None:
        """Close the kept connections, if any (a later call opens new ones)."""
        if self.lanes is not None:
            self.lanes.close()


def _node_client(node: Any) -> Any:
    """One cluster node's client: redis-py calls it ``redis_connection``, valkey-py ``valkey_connection``."""
    client = getattr(node, "redis_connection", None) or getattr(node, "valkey_connection", None)
    if client is None:
        raise AttributeError(f"cluster node {getattr(node, 'name', node)!r} has no client")
    return client


def _refresh(cluster: Any) -> None:
    """Have ``cluster`` read its slot map again, if a node answers; if none does, the next call tries."""
    with contextlib.suppress(Exception):  # every node down, or the failover not over
        cluster.nodes_manager.initialize()


def _piped(
    client: Any,
    script: Script,
    numkeys: int,
    items: Sequence[Any],
    wait: tuple[int, int],
    *,
    asking: bool = False,
) -> tuple[Any, int | Exception]:
    """``EVALSHA`` then ``WAIT`` through ``client``'s pipeline: one connection, one round trip.

    An error reply to the script is raised once both replies are read (the
    script loaded and both sent again if the server did not know it); one to
    ``WAIT`` is returned in place of its count.
    """
    for attempt in (0, 1):
        pipe = client.pipeline(transaction=False)
        if asking:
            pipe.execute_command("ASKING")
        pipe.evalsha(script.sha, numkeys, *items)
        pipe.execute_command("WAIT", *wait)
        replies = pipe.execute(raise_on_error=False)
        reply, acked = replies[-2:]
        if is_noscript(reply) and not attempt:
            script.sha = client.script_load(script.script)
            continue
        if isinstance(reply, Exception):
            raise reply
        return reply, acked if isinstance(acked, Exception) else int(acked)
    raise AssertionError("unreachable")  # pragma: no cover


def is_noscript(exc: BaseException) -> bool:
    """The server does not know the script (restart, SCRIPT FLUSH), whichever client says so.

    redis-py's class, a fork's of the same name (valkey-py's), or the bare error reply
    (a client that raises every reply as one class).
    """
    return (
        isinstance(exc, NoScriptError)
        or type(exc).__name__ == "NoScriptError"
        or str(exc).startswith("NOSCRIPT")
    )


_CHUNK = 65536
_INTEGER, _STRING, _ERROR, _STATUS, _ARRAY = 58, 36, 45, 43, 42  # ":", "$", "-", "+", "*"


def _exchange(sock: Any, command: bytes) -> Any:
    """Send ``command`` on ``sock`` and read its one reply: an integer, string, status, error or array.

    Socket failures become redis-py's own ``TimeoutError`` / ``ConnectionError``,
    and an error reply the ``ResponseError`` redis-py would raise for it; a
    reply of any other type, or more than one, is an ``InvalidResponse``.
    """
    data = b""
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
                elif kind == _ARRAY:  # the semaphore scripts' replies: off the lock scripts' path
                    return _array(sock, data)
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
    except (OSError, ValueError) as exc:
        raise _wire_error(exc, data) from exc
    raise _RESP2Parser.parse_error(data[1:end].decode("utf-8", "replace"))  # type: ignore[no-untyped-call]


def _wire_error(exc: Exception, data: bytes) -> Exception:
    """The redis-py error for a failure while sending or reading: a socket's, or a bad length."""
    if isinstance(exc, TimeoutError):  # socket.timeout
        return redis.TimeoutError("Timeout reading from socket")
    if isinstance(exc, OSError):
        return redis.ConnectionError(f"Error while talking to the server: {exc}")
    return redis.InvalidResponse(f"bad reply {data[:40]!r}")  # a length or an integer that is not one


def _exchange_pair(sock: Any, command: bytes) -> tuple[Any, int | Exception]:
    """Send ``command``, two commands (a script, then ``WAIT``), and read both replies.

    Both are read before either is acted on, so the connection stays in step:
    an error reply to the first is raised then, as :func:`_exchange` raises it;
    the second is an integer, or the error ``WAIT`` replied (returned, not raised).
    """
    reply, acked = _replies(sock, command, count=2)
    if isinstance(reply, Exception):
        raise reply
    if type(acked) is not int and not isinstance(acked, redis.ResponseError):
        raise redis.InvalidResponse(f"WAIT replied {acked!r}")
    return reply, acked


def _replies(sock: Any, command: bytes, *, count: int) -> list[Any]:
    """Send ``command``, ``count`` commands, and read their ``count`` replies, all before any is acted on.

    An error reply is returned in its place, as the ``ResponseError`` redis-py
    would raise for it; socket failures and bad lengths are raised as :func:`_exchange` raises them.
    """
    data = b""
    replies: list[Any] = []
    try:
        sock.sendall(command)
        data = _more(sock)
        at = 0
        while len(replies) < count:
            try:
                if data[at : at + 1] == b"-":
                    end = data.find(b"\r\n", at)
                    if end < 0:
                        raise _Short
                    text = data[at + 1 : end].decode("utf-8", "replace")
                    value: Any = _RESP2Parser.parse_error(text)  # type: ignore[no-untyped-call]
                    at = end + 2
                else:
                    value, at = _parse(data, at)
            except _Short:
                data += _more(sock)
                continue
            replies.append(value)
        if at != len(data):
            raise redis.InvalidResponse(f"more than {count} replies to {count} commands")
    except (OSError, ValueError) as exc:
        raise _wire_error(exc, data) from exc
    return replies


class _Short(Exception):
    """The reply read so far ends before the value being parsed does."""


def _array(sock: Any, data: bytes) -> Any:
    """Read the rest of an array reply that ``data`` starts: a list of ints, bytes, None and lists.

    Called inside :func:`_exchange`, whose handlers turn socket failures and
    bad lengths into redis-py's errors.
    """
    while True:
        try:
            value, at = _parse(data, 0)
        except _Short:
            data += _more(sock)
            continue
        if at != len(data):
            raise redis.InvalidResponse("more than one reply to one command")
        return value


def _parse(data: bytes, at: int) -> tuple[Any, int]:
    """The value that starts at ``data[at]`` and where the next one starts; _Short if it is not all here."""
    end = data.find(b"\r\n", at)
    if end < 0:
        raise _Short
    if end == at:
        raise redis.InvalidResponse("a reply with no type")
    kind = data[at]
    if kind == _STRING:
        length = int(data[at + 1 : end])
        if length < 0:
            return None, end + 2
        stop = end + 2 + length
        if len(data) < stop + 2:
            raise _Short
        return data[end + 2 : stop], stop + 2
    if kind == _INTEGER:
        return int(data[at + 1 : end]), end + 2
    if kind == _ARRAY:
        count = int(data[at + 1 : end])
        at = end + 2
        if count < 0:
            return None, at
        items = []
        for _ in range(count):
            item, at = _parse(data, at)
            items.append(item)
        return items, at
    if kind == _STATUS:
        return data[at + 1 : end], end + 2
    # an error inside an array, or no RESP2 type: no script of ours replies so
    raise redis.InvalidResponse(f"unexpected reply type {chr(kind)!r} in an array")


def _more(sock: Any) -> bytes:
    chunk: bytes = sock.recv(_CHUNK)
    if not chunk:
        raise redis.ConnectionError("Connection closed by server.")
    return chunk
