"""RedisAsync: the Redis store's primitives awaited through ``redis.asyncio`` (or ``valkey.asyncio``).

Each primitive sends the very script call the sync store makes
(:meth:`RedisBackend.call`: the same scripts, keys and arguments, packed by
the same ``_transport`` functions) and reads its reply with the same reader,
so the two paths differ only in how the bytes travel: one round trip per
primitive here too. With ``replicas=N`` a grant goes with ``WAIT`` behind it
on the same connection, in the same round trip, and is judged by the sync
store's own rules (``_acks``: its steps awaited here, called there).

The async client is built from the sync client's own settings (host or
socket path, db, password, TLS, timeouts, ``decode_responses``), of the same
library (redis-py, or valkey-py for its clients), one per event loop (an
asyncio connection belongs to the loop that opened it). Where a call goes:

- one server, or a Sentinel service's master (:class:`_Server`): a connection
  of the loop's pool, kept between calls; a Sentinel pool asks the Sentinels
  for the master on each new connection, and drops its connections when the
  old master answers as a replica, so a failover is followed on the next call;
- a cluster (:class:`_Cluster`): a connection to the primary that owns the
  call's slot (every key of one call shares it), a ``MOVED`` followed once
  after reading the slot map again, an ``ASK`` once (``ASKING`` first, in the
  same write), the script loaded on the primaries if a node lacks it, and the slot map
  read again when a node cannot be reached, so the next call finds the new
  owner. As the sync store does (``_transport.Scripts._on_owner``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import redis
from redis.commands.core import Script

from ...errors import ConfigurationError
from ..aio import AsyncBackend
from ..base import Backend
from ._acks import COUNT, RUN, Judging, connected_in
from ._client import _classes, where
from ._store import RedisBackend, _check_wait
from ._transport import evalsha_head, is_noscript, pack, pack_after

__all__ = ["POOL_SIZE", "RedisAsync", "async_client_of"]

#: Connections an event loop's async client opens at most (or the sync pool's own limit, if lower);
#: more calls at once wait their turn for one, as long as the socket timeout allows.
POOL_SIZE = 64

# The sync pools' connection classes that have an asyncio twin of the same name (redis-py's, valkey-py's).
_PLAIN = ("Connection", "SSLConnection", "UnixDomainSocketConnection")
_SENTINEL = ("SentinelManagedConnection", "SentinelManagedSSLConnection")

# Settings a sync pool holds for its own use (its handlers, a proxy of itself): never handed on.
_OWN = frozenset({
    "connection_pool", "redis_connect_func", "maint_notifications_pool_handler",
    "oss_cluster_maint_notifications_handler", "himport_registry", "connection_class",
})  # fmt: skip


class _Library(NamedTuple):
    """A client library's sync and asyncio packages, and its asyncio client classes."""

    sync: Any  # redis / valkey
    aio: Any  # redis.asyncio / valkey.asyncio
    client: Any  # redis.asyncio.Redis / valkey.asyncio.Valkey
    cluster: Any  # their RedisCluster / ValkeyCluster


def _library(client: Any) -> _Library:
    """The library of ``client``: redis-py's, or valkey-py's for its clients."""
    if type(client).__module__.partition(".")[0] == "valkey":
        import valkey
        import valkey.asyncio
        import valkey.asyncio.cluster
        import valkey.asyncio.sentinel
        import valkey.sentinel

        return _Library(valkey, valkey.asyncio, valkey.asyncio.Valkey, valkey.asyncio.cluster.ValkeyCluster)
    import redis.asyncio.cluster
    import redis.asyncio.sentinel
    import redis.sentinel

    return _Library(redis, redis.asyncio, redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)


def _refused(client: Any, why: str) -> ConfigurationError:
    return ConfigurationError(
        f"the asyncio API takes a plain redis://, rediss:// or unix:// client, a cluster client or a "
        f"Sentinel master_for client; {where(client)} ({type(client).__name__}) {why}"
    )


def _settings(kwargs: dict[str, Any], twin: type[Any], lib: _Library) -> dict[str, Any]:
    """``kwargs`` of a sync connection (or client) that ``twin``, its asyncio counterpart, takes.

    A retry policy is made again as the asyncio one (the same backoff, tries and errors).
    """
    taken: set[str] = set()
    for cls in inspect.getmro(twin):
        with contextlib.suppress(TypeError, ValueError):
            taken.update(inspect.signature(vars(cls).get("__init__", object.__init__)).parameters)
    out = {name: value for name, value in kwargs.items() if name in taken and name not in _OWN}
    retry = out.get("retry")
    if retry is not None and not isinstance(retry, lib.aio.retry.Retry):
        out["retry"] = lib.aio.retry.Retry(retry._backoff, retry._retries, retry._supported_errors)
    return out


def async_client_of(client: Any) -> Any:
    """An asyncio client to what ``client`` (a sync redis-py or valkey-py client) talks to, as it does."""
    return _maker(client)()


def _maker(client: Any) -> Callable[[], Any]:
    """What makes :func:`async_client_of`'s client (made in the loop that uses it, not now).

    One server (a plain pool of the library's own connections), a Sentinel
    ``master_for`` client, or a cluster client; :class:`ConfigurationError` for
    a client of another kind (a pool or connection class of its own, a replica's).
    """
    lib = _library(client)
    if callable(getattr(client, "get_node_from_key", None)):
        return partial(_cluster_twin, client, lib)
    pool = getattr(client, "connection_pool", None)
    kind = getattr(pool, "connection_class", None)
    if isinstance(getattr(pool, "service_name", None), str):
        name = next((n for n in _SENTINEL if kind is getattr(lib.sync.sentinel, n, None)), None)
        if name is None or not getattr(pool, "is_master", False):
            raise _refused(client, "is not a Sentinel master client of the library's own connections")
        return partial(_sentinel_twin, pool, getattr(lib.aio.sentinel, name), lib)
    name = next((n for n in _PLAIN if kind is getattr(lib.sync, n, None)), None)
    if name is None or type(pool) is not lib.sync.ConnectionPool:
        shown = getattr(kind, "__name__", kind)
        raise _refused(client, f"on a {type(pool).__name__} of {shown} has no asyncio counterpart here")
    return partial(_server_twin, pool, getattr(lib.aio, name), lib)


def _server_twin(pool: Any, twin: type[Any], lib: _Library) -> Any:
    settings = _settings(pool.connection_kwargs, twin, lib)
    size = min(POOL_SIZE, pool.max_connections)
    wait = settings.get("socket_timeout")
    return lib.client(
        connection_pool=lib.aio.BlockingConnectionPool(
            connection_class=twin, max_connections=size, timeout=wait, **settings
        )
    )


def _sentinel_twin(pool: Any, twin: type[Any], lib: _Library) -> Any:
    manager = pool.sentinel_manager
    found = [s.connection_pool.connection_kwargs for s in manager.sentinels]
    sentinels = lib.aio.sentinel.Sentinel(
        [(kwargs["host"], kwargs["port"]) for kwargs in found],
        min_other_sentinels=manager.min_other_sentinels,
        sentinel_kwargs=_settings(manager.sentinel_kwargs, lib.aio.Connection, lib),
    )
    return sentinels.master_for(
        pool.service_name, redis_class=lib.client, connection_class=twin,
        check_connection=pool.check_connection, max_connections=POOL_SIZE,
        **_settings(pool.connection_kwargs, twin, lib),
    )  # fmt: skip


def _cluster_twin(client: Any, lib: _Library) -> Any:
    manager = client.nodes_manager
    kwargs = dict(manager.connection_kwargs)
    settings = _settings(kwargs, lib.cluster, lib)
    if kwargs.get("connection_class") is lib.sync.SSLConnection:  # rediss+cluster://: the nodes speak TLS
        settings["ssl"] = True
    seeds: dict[str, Any] = {}
    for node in [*manager.startup_nodes.values(), *client.get_nodes()]:
        seeds.setdefault(node.name, lib.aio.cluster.ClusterNode(node.host, node.port))
    return lib.cluster(startup_nodes=list(seeds.values()), max_connections=POOL_SIZE, **settings)


async def _reply(conn: Any) -> Any:
    """One reply read from ``conn``: an error reply returned (as the library's ResponseError), not raised."""
    try:
        return await conn.read_response()
    except _classes("ResponseError") as exc:
        return exc


async def _exchange(conn: Any, command: bytes, count: int) -> list[Any]:
    """Send ``command`` (``count`` commands) on ``conn``; read every reply before any is acted on."""
    await conn.send_packed_command(command, check_health=False)
    return [await _reply(conn) for _ in range(count)]


class _Server:
    """One event loop's async client of one server (or a Sentinel master), and its kept idle connections.

    A call takes an idle kept connection (a list pop) rather than going through the
    pool's lock and condition each time; the pool still bounds how many there are. A
    pool that refuses a connection past its limit rather than waiting for one (a
    Sentinel pool) is gated here instead: as many calls at once as it has connections.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.idle: list[Any] = []
        self.waiting = 0  # calls waiting for the pool to give them a connection
        pool = client.connection_pool
        self._named = _named(pool)
        waits = type(pool).__name__ == "BlockingConnectionPool"
        self._gate = None if waits else asyncio.Semaphore(min(POOL_SIZE, pool.max_connections))

    async def send(self, key: Any, command: bytes, count: int = 1) -> list[Any]:
        """Send ``command`` (``count`` commands) on a kept connection; their replies, errors in place.

        A connection whose exchange did not end (an error on the wire, a cancelled
        task) goes back to the pool closed, never to the next caller mid-reply.
        """
        if self._gate is None:
            return await self._send(command, count)
        async with self._gate:  # (each call that holds it has a connection, kept or new)
            return await self._send(command, count)

    async def _send(self, command: bytes, count: int) -> list[Any]:
        pool = self.client.connection_pool
        if self.idle:
            conn = self.idle.pop()
        else:
            self.waiting += 1
            try:
                conn = await pool.get_connection(*self._named)
            finally:
                self.waiting -= 1
        try:
            replies = await _exchange(conn, command, count)
        except BaseException:
            await conn.disconnect()
            await pool.release(conn)
            raise
        if self.waiting:  # hand it back to the pool while other calls wait for one there
            await pool.release(conn)
        else:
            self.idle.append(conn)
        return replies

    async def load(self, key: Any, source: Any) -> None:
        await self.client.script_load(source)

    async def aclose(self) -> None:
        pool = self.client.connection_pool
        for conn in self.idle:
            await pool.release(conn)
        self.idle = []
        await self.client.aclose()


class _Cluster:
    """One event loop's async cluster client: each call sent to the primary that owns its key's slot."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._ready = False
        self._reading = asyncio.Lock()  # one reading of the slot map at a time
        self._slots = asyncio.Semaphore(POOL_SIZE)  # a node refuses a connection past its limit

    async def _owner(self, key: Any) -> Any:
        if not self._ready:
            async with self._reading:
                if not self._ready:
                    await self.client.initialize()
                    self._ready = True
        return self.client.get_node_from_key(key)

    async def _on(self, node: Any, command: bytes, count: int) -> list[Any]:
        async with self._slots:
            conn = node.acquire_connection()
            try:
                replies = await _exchange(conn, command, count)
            except BaseException:
                await conn.disconnect()
                _release(node, conn)
                raise
            _release(node, conn)
            return replies

    async def send(self, key: Any, command: bytes, count: int = 1) -> list[Any]:
        """Send ``command`` to the primary that owns ``key``'s slot; one redirect followed.

        A node that cannot be reached (a master killed, say) makes the client read the
        slot map again before the error is raised, so the next call goes to whichever
        node owns the slot then.
        """
        try:
            replies = await self._on(await self._owner(key), command, count)
            moved = replies[0]
            if isinstance(moved, _classes("MovedError")):  # the slot map this client holds is out of date
                await self._refresh(strict=True)
                return await self._on(self.client.get_node_from_key(key), command, count)
            if isinstance(moved, _classes("AskError")):  # the slot is moving: ask the node it names
                ask: Any = moved
                target = self.client.get_node(host=ask.host, port=ask.port)
                if target is None:
                    return replies
                return (await self._on(target, _ASKING + command, count + 1))[1:]
            return replies
        except _classes("ConnectionError") + _classes("TimeoutError") + (OSError,):
            await self._refresh()
            raise

    async def _refresh(self, *, strict: bool = False) -> None:
        """Read the slot map again; unless ``strict``, a failure is left to the next call (a node down)."""
        async with self._reading:
            try:
                await self.client.nodes_manager.initialize()
            except Exception:
                if strict:
                    raise

    async def load(self, key: Any, source: Any) -> None:
        """Load ``source`` on every primary (the client's ``SCRIPT LOAD``): the node that lacked it
        may be the owner of ``key``'s slot or the one an ``ASK`` named."""
        await self._owner(key)
        await self.client.script_load(source)

    async def aclose(self) -> None:
        await self.client.aclose()


def _release(node: Any, conn: Any) -> None:
    """Give ``conn`` back to its cluster node: redis-py's ``release``; valkey-py's nodes, which have
    none, take it back on their free list as their own calls do."""
    release = getattr(node, "release", None)
    if callable(release):
        release(conn)
    else:
        node._free.append(conn)


def _wire(made: Any) -> _Server | _Cluster:
    """How this loop reaches what the async client ``made`` talks to (see the module's docstring)."""
    return _Cluster(made) if callable(getattr(made, "get_node_from_key", None)) else _Server(made)


class RedisAsync(AsyncBackend):
    """Awaits a :class:`RedisBackend`'s primitives on an async client to the same server or cluster.

    Each script call is packed as the sync store packs it (``_transport``) and sent
    where the sync store would send it (see the module's docstring).
    """

    sync: RedisBackend

    def __init__(self, sync: Backend) -> None:
        assert isinstance(sync, RedisBackend)
        super().__init__(sync)
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Server | _Cluster] = (
            weakref.WeakKeyDictionary()
        )
        self._make = _maker(sync.client)  # a client with no async twin fails here, at first use
        client: Any = sync.client
        pool = getattr(client, "connection_pool", None) or client.nodes_manager  # a cluster: its nodes'
        settings = pool.connection_kwargs
        self._encoding = (settings.get("encoding", "utf-8"), settings.get("encoding_errors", "strict"))
        self._heads: dict[tuple[str, int, int], bytes] = {}

    def _wire(self) -> _Server | _Cluster:
        loop = asyncio.get_running_loop()
        mine = self._loops.get(loop)
        if mine is None:
            made = self._make()
            if self.sync.replicas:  # the sync store's check, on the client the grants go through here
                _check_wait(made, self.sync.replica_timeout)
            mine = self._loops[loop] = _wire(made)
        return mine

    def client(self) -> Any:
        """The async client of the running event loop (made on its first call)."""
        return self._wire().client

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        sync = self.sync
        call = sync.call(name, *args, **kwargs)
        acks = sync._acks
        if acks is not None and call.grant is not None:  # as the sync store's _done decides
            return call.decode(await self._drive(acks.granting(call, sync, sync.name, sync._failure)))
        return call.decode(await self._sent(call))

    async def _sent(self, call: Any) -> Any:
        """Send ``call``'s script (no wait); its raw reply. Errors as the sync store raises them."""
        try:
            (reply,) = await self._run(call.script, call.numkeys, call.items)
        except Exception as exc:
            raise self.sync._failure(exc, call.items[: call.numkeys]) from exc
        return reply

    async def _run(self, script: Script, numkeys: int, items: Sequence[Any], wait: bytes = b"") -> list[Any]:
        """The script's reply (and ``wait``'s, if any, sent behind it); an error reply to the script raised.

        The script is loaded again, and both sent again, on a server that does not know it.
        """
        wire = self._wire()
        command = pack_after(self._head(script.sha, numkeys, len(items)), items, *self._encoding) + wait
        count = 2 if wait else 1
        replies = await wire.send(items[0], command, count)
        if is_noscript(replies[0]):  # a restarted or flushed server (or node): load it, once, and send again
            await wire.load(items[0], script.script)
            replies = await wire.send(items[0], command, count)
        if isinstance(replies[0], Exception):
            raise replies[0]
        return replies

    async def _drive(self, steps: Judging) -> Any:
        """Await ``steps`` (``_acks``: the sync store's rules) to the end; the result."""
        acks = self.sync._acks
        assert acks is not None
        reply: Any = None
        error: Exception | None = None
        while True:
            try:
                what, arg = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as done:
                return done.value
            try:
                if what == RUN:
                    reply, acked = await self._run(arg.script, arg.numkeys, arg.items, acks.wait_command)
                    if type(acked) is not int and not isinstance(acked, Exception):
                        raise redis.InvalidResponse(f"WAIT replied {acked!r}")
                    reply = (reply, acked)
                elif what == COUNT:
                    reply = await self._connected(arg)
                else:  # UNDO: the undo's call, sent as any other
                    reply = await self._sent(arg())
                error = None
            except Exception as exc:  # thrown into the steps, where the rules handle it
                reply, error = None, exc

    async def _connected(self, name: Any) -> int | None:
        """How many replicas the master that holds ``name`` has connected; None if it cannot be told."""
        try:
            (info,) = await self._wire().send(name, _INFO)
        except Exception:  # only for a message: the call fails with its own error
            return None
        return connected_in(info)

    async def evalsha(self, script: Script, numkeys: int, items: Sequence[Any]) -> Any:
        """Send ``script`` with ``items`` on this loop's connections; its raw reply (no replica wait).

        The concurrency slots' async store (``_async_semaphores``) sends its scripts through this.
        """
        (reply,) = await self._run(script, numkeys, items)
        return reply

    def _head(self, sha: str, numkeys: int, count: int) -> bytes:
        head = self._heads.get((sha, numkeys, count))
        if head is None:
            head = self._heads[(sha, numkeys, count)] = evalsha_head(sha, numkeys, count)
        return head

    async def ping(self) -> Any:
        """PING through this loop's client (the benchmarks' yardstick)."""
        return await self.client().ping()

    async def kept_ping(self) -> Any:
        """PING on one of this loop's kept connections, as the script calls go."""
        (reply,) = await self._wire().send(_PING_KEY, _PING)
        return reply

    async def aclose(self) -> None:
        """Close the running loop's client and its kept connections."""
        mine = self._loops.pop(asyncio.get_running_loop(), None)
        if mine is not None:
            await mine.aclose()


_PING = pack(["PING"])
_PING_KEY = "ping"  # on a cluster, the node a PING goes to: that of this key's slot
_INFO = pack(["INFO", "replication"])
_ASKING = pack(["ASKING"])


def _named(pool: Any) -> tuple[str, ...]:
    """What ``pool.get_connection()`` is given: nothing where the command name is optional
    (redis-py 5.3 and later deprecate it); valkey-py's and older redis-py's need one."""
    with contextlib.suppress(TypeError, ValueError):
        named = inspect.signature(pool.get_connection).parameters.get("command_name")
        if named is not None and named.default is inspect.Parameter.empty:
            return ("EVALSHA",)
    return ()
