"""RedisBackend: locks in Redis, for many hosts.

Each primitive is one Lua script, so one round trip and one atomic step. The
scripts read the server's clock (``TIME``), never the client's. The keys of
one lock key share a hash tag, ``<namespace>:{<key>}:q`` (queue lock),
``...:r`` (run lock) and ``...:f`` (its last fence), so every script touches
one cluster slot (a key that starts with ``}`` is named another way:
``_client.names``). Listing uses ``SCAN``, never ``KEYS``, on every primary
of a cluster (``_listing``).

The scripts are called through ``_wire.Wire`` (the client's ``evalsha``, its
pipelines); a success is an integer (1, or the fence of a run lock).

Whatever the client raises (redis-py's errors, a cluster or valkey client's
own, a bug in a wire path) reaches the caller as :class:`BackendError` with
the cause chained; a record of the wrong shape or type as
:class:`CorruptRecordError` naming its Redis key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar, cast

import redis
from redis.commands.core import Script

from ...errors import BackendError, ConfigurationError, CorruptRecordError
from ...locks import Holder, LockState, PendingCall, QueueMeta, RunClaim
from .._drops import WINDOW, Tally, minute
from ..base import Backend, Coalesce, Debounce, Overlap, OverlapMode, QueueMode
from ..semaphores import SemaphoreStore
from . import _listing, _overlap
from . import _lua as lua
from . import _lua_settle as settle
from ._acks import Acks, check_wait, claimed, coalesced, if_one, started
from ._client import backend_error, client_for, key_of, names, redis_client_from_url, where
from ._replies import COALESCED, latest, parts, pending_call
from ._semaphores import RedisSemaphores
from ._url import check_store_options, parse
from ._wire import Wire, text

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["RedisBackend", "from_url"]

T = TypeVar("T")

_QUEUE_MODES: dict[QueueMode, str] = {"run": "r", "release": "x", "keep": "k", "own": "o"}
_COALESCE = {"keep_last": "l", "replace": "p"}  # CLAIM's coalesce argument
_QUIET = "Q"  # the mark of a snapshot that need not be read: see _lua's snapshot()
_JOB = "J"  # the mark of one that need not be read while its job is young
_PARTS = ("q", "r", "f")  # queue lock, run lock, last fence
_TALLIED = (*_PARTS, "d")  # and the dropped duplicates (_lua.count_drop), in the same slot


class Call(NamedTuple, Generic[T]):
    """One primitive's script call: the script, how many of ``items`` are keys, and its reply's reader.

    ``grant`` names what a reply granted ("": nothing), for a primitive whose grant replicas must
    acknowledge (``replicas``; see _acks), and ``undo`` makes, from that reply, the call that takes
    the grant back, token-checked (a call, not sent: the sync store and the asyncio face each send
    it their way), or None if nothing of the caller's own can be taken back.
    """

    script: Script
    numkeys: int
    items: list[Any]
    decode: Callable[[Any], T]
    grant: Callable[[Any], str] | None = None
    undo: Callable[[Any], Call[Any] | None] | None = None


class RedisBackend(Backend):
    """Locks in Redis, shared by every host that talks to the same server.

    ``client`` is a redis-py client (``decode_responses`` on or off; on one
    server, a ``RedisCluster`` or a Sentinel ``master_for`` client), valkey-py's
    ``Valkey`` or ``ValkeyCluster``, or a URL
    (``redis://``, ``rediss://``, ``unix://``; checked by
    :func:`uniqjob.stores.redis.redis_client_from_url`). A URL gets bounded socket
    timeouts (``timeout`` seconds), so an unreachable server fails the call
    with :class:`BackendError` in bounded time; the job is then not run.

    Its calls go through the client's public API (``evalsha``, pipelines), on
    its own pool with its own retry policy and health checks; :meth:`close`
    closes the client.
    """

    name = "redis"

    def __init__(
        self,
        client: Client | str,
        *,
        namespace: str = "uniqjob",
        timeout: float = 5.0,
        replicas: int = 0,
        replica_timeout: float = 1.0,
    ) -> None:
        check_store_options(namespace, replicas)
        if not (isinstance(replica_timeout, int | float) and 0 < replica_timeout < float("inf")):
            raise ConfigurationError(
                f"replica_timeout must be a number of seconds > 0, got {replica_timeout!r}"
            )
        #: How many replicas must acknowledge each grant (Redis WAIT) before it counts; 0: none.
        self.replicas = replicas
        #: How long to wait for that acknowledgement, in seconds, before the grant is undone.
        self.replica_timeout = float(replica_timeout)
        if isinstance(client, str):
            client = redis_client_from_url(client, timeout=timeout)
        # A cluster client answers the same commands (its own way): one type for the code below.
        self.client = cast("redis.Redis", client)
        if replicas:
            check_wait(client, self.replica_timeout)
        self.namespace = namespace
        self._prefix = namespace + ":"
        self._holder: tuple[Holder | None, list[str]] = (None, [])
        try:
            client.execute_command  # noqa: B018  (not a client at all: a ConfigurationError now)
            self._wire = Wire(client)
            script = client.register_script
            self._claim = script(lua.CLAIM)
            self._start = script(lua.START)
            self._renew = script(settle.RENEW)
            self._attach = script(settle.ATTACH)
            self._requeue = script(settle.REQUEUE)
            self._finish = script(settle.FINISH)
            self._dequeue = script(settle.DEQUEUE)
            self._reclaim = script(settle.RECLAIM)
            self._read = script(_overlap.READ)
            self._purge = script(settle.PURGE)
            self._overlap = script(_overlap.OVERLAP)
            self._acks = Acks(self._wire, replicas, self.replica_timeout) if replicas else None
        except Exception as exc:
            raise ConfigurationError(f"cannot use {where(client)} as a Redis client: {exc!r}") from exc

    def semaphores(self) -> SemaphoreStore:
        """A new semaphore store on this server and client, under ``<namespace>:c:``."""
        return RedisSemaphores(
            self.client,
            namespace=self.namespace,
            replicas=self.replicas,
            replica_timeout=self.replica_timeout,
        )

    def __repr__(self) -> str:
        return f"RedisBackend({where(self.client)})"

    def _keys(self, key: str) -> list[str]:
        return names(self._prefix, key, _PARTS)

    def _fail(self, exc: Exception) -> BackendError:
        """The BackendError a caller sees for ``exc``, naming the server (raise it ``from exc``)."""
        return backend_error(exc, self, self.name)

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except Exception as exc:
            raise self._fail(exc) from exc

    def _failure(self, exc: Exception, names: list[Any]) -> BackendError:
        """What a script call that raised ``exc`` on keys ``names`` raises instead (``from exc``):
        a CorruptRecordError naming the key a ``UNIQJOB_CORRUPT`` reply points at, else a BackendError."""
        found = lua.corrupt_reply(exc, len(names))
        if found is None:
            return self._fail(exc)
        name = text(names[found[0]])
        key = key_of(self._prefix, name, name[-1:]) or name
        return CorruptRecordError(name, found[1], key=key, backend=self.name)

    def _state(self, key: str, reply: str, *, now: bool = False) -> LockState:
        """The state a snapshot reply describes, each field checked (``_replies``); the usual
        duplicate's ("Q", or "J" with its job's age) unread until used, unless read ``now``."""
        age = None
        if reply[:1] == _JOB:  # 'J<µs> ' then the snapshot: see _lua's snapshot()
            head, _, reply = reply.partition(" ")
            age = int(head[1:]) / 1_000_000 if head[1:].isdigit() else None  # else read at once
        read = partial(parts, key, reply, self._keys(key), self.name)
        if now or (age is None and reply[:1] != _QUIET):
            return LockState(key, *read())
        return LockState.unread(key, read, nothing_to_reclaim=age is None, job_age=age)

    def _items(
        self,
        key: str,
        token: str,
        meta: QueueMeta,
        ttl: float | None,
        *,
        flag: str,
        run: RunClaim | None,
        keys: tuple[str, ...],
    ) -> list[Any]:
        """The Redis names of ``key``'s ``keys`` (its parts), then ARGV by name: _lua.QUEUE_ARGV, ``flag``
        (CLAIM's mode, START's flags or REQUEUE's attempt), then with ``run`` _lua.RUN_ARGV (see
        CLAIM_ARGV, START_ARGV, REQUEUE_ARGV)."""
        cls, cls_len = meta.cls, ""
        if cls and key.startswith(cls):
            cls, cls_len = "", str(len(cls))  # the key already holds it
        ttl_ms = str(_ms(ttl)) if ttl else "0"  # text: the encoder's quickest case
        items = [*names(self._prefix, key, keys), token, ttl_ms, cls, cls_len, meta.args, meta.job_id, flag]
        if run is not None:
            holder = run.holder
            said = self._holder
            if said[0] is not holder:  # nearly always this process: its fields as text, once
                said = self._holder = (
                    holder,
                    [holder.host, holder.node, str(holder.pid), str(holder.pstart)],
                )
            items += said[1]
            items += [str(_ms(run.lease)), run.attempt]
        return items

    # Each primitive is a script call (:class:`Call`: what to send, and how to read the reply) and
    # its sending; the calls are the async store's too (_async.RedisAsync), only the sending differs.

    def _done(self, call: Call[T]) -> T:
        """Send ``call``; a grant with ``WAIT`` behind it when replicas must acknowledge it (see _acks).

        A grant too few replicas acknowledged is undone by ``call.undo`` and fails closed.
        """
        acks = self._acks
        if acks is None or call.grant is None:
            return call.decode(self._eval(call.script, call.numkeys, call.items))
        try:
            reply, acked = acks.wire.acked(call.script, call.numkeys, call.items, acks.wait)
        except Exception as exc:
            raise self._failure(exc, call.items[: call.numkeys]) from exc
        what = call.grant(reply)
        if what:
            undo = call.undo(reply) if call.undo is not None else None
            acks.confirm(
                acked, what, undo and (lambda: self._done(undo)), self, self.name, name=call.items[0]
            )
        return call.decode(reply)

    def _eval(self, script: Script, numkeys: int, items: list[Any]) -> Any:
        """Run ``script`` with ``items``: its ``numkeys`` keys, then its arguments; its raw reply."""
        try:
            return self._wire.call(script, numkeys, items)
        except Exception as exc:
            raise self._failure(exc, items[:numkeys]) from exc

    def _granted(self, key: str, run: RunClaim | None, meta: QueueMeta, reply: Any) -> LockState | None:
        """A CLAIM or START reply: None when taken (1, the fence, or {fence, call}), else the state"""
        if type(reply) is int:
            if run is not None:
                run.fence = reply
            return None
        if type(reply) is list and run is not None:
            run.fence, run.call = int(reply[0]), text(reply[1])
            return None
        if reply[:1] == "l":
            return latest(key, meta, reply, self.name)
        coalesced = COALESCED.get(reply[:1], "")
        state = self._state(key, reply[1:] if coalesced else reply)
        state.coalesced = coalesced
        return state

    def _claim_call(
        self,
        key: str,
        token: str,
        *,
        meta: QueueMeta,
        ttl: float | None = None,
        run: RunClaim | None = None,
        count: bool = False,
        counted: float | None = None,
        coalesce: Coalesce = "",
        debounce: Debounce | None = None,
    ) -> Call[LockState | None]:
        flag = ("q" if run is None else "r") + _drop(count, counted)
        items = self._items(key, token, meta, ttl, flag=flag, run=run, keys=_TALLIED)
        if meta.call or coalesce or debounce:  # CLAIM_ARGV's tail (none on the usual path)
            wait, longest = debounce or (0.0, None)
            items += [meta.call, _COALESCE.get(coalesce, ""),
                      str(_ms(wait)) if debounce else "", str(_ms(longest)) if longest else ""]  # fmt: skip
        decode = partial(self._granted, key, run, meta)
        if self._acks is None:  # no replicas to acknowledge it: no grant text, nothing to undo
            return Call(self._claim, 4, items, decode)
        def undo(reply: Any) -> Call[bool] | None:  # a call coalesced into another's lock has none
            return None if coalesced(reply) else self._reclaim_call(key, token, token if run else None)

        return Call(self._claim, 4, items, decode, partial(claimed, key, run is not None), undo)

    def _start_call(
        self,
        key: str,
        token: str,
        *,
        run: RunClaim,
        meta: QueueMeta,
        ttl: float | None = None,
        adopt: bool = False,
        queue_lock: QueueMode = "run",
        count: bool = False,
        counted: float | None = None,
    ) -> Call[LockState | None]:
        flags = ("a" if adopt else "-") + _QUEUE_MODES[queue_lock] + _drop(count, counted)
        items = self._items(key, token, meta, ttl, flag=flags, run=run, keys=_TALLIED)
        decode = partial(self._granted, key, run, meta)
        if self._acks is None:
            return Call(self._start, 4, items, decode)
        # Undone: the run lock of this token and attempt; the queue lock is left as a failed
        # start leaves it (an orphan once the run lock is gone, reclaimed by the next claim).
        def undo(reply: Any) -> Call[PendingCall | None]:
            return self._finish_call(key, token, keep_queue=True, attempt=run.attempt)

        return Call(self._start, 4, items, decode, partial(started, key), undo)

    def _attach_call(self, key: str, token: str, job_id: str) -> Call[bool]:
        return Call(self._attach, 1, [self._keys(key)[0], token, job_id], bool)

    def _requeue_call(
        self, key: str, token: str, *, meta: QueueMeta, ttl: float | None, attempt: str = ""
    ) -> Call[bool]:
        # REQUEUE touches no fence: its keys are the two locks only; its ARGV ends with the attempt.
        items = self._items(key, token, meta, ttl, flag=attempt, run=None, keys=_PARTS[:2])
        return Call(self._requeue, 2, items, bool)

    def _renew_call(self, key: str, token: str, lease: float, attempt: str = "") -> Call[bool]:
        # A renewal extends a held lease: nothing to undo, but one the replicas did not see must not
        # count as confirmed, or the holder would trust a lease a promoted replica ends sooner.
        what = partial(if_one, f"the lease of the run lock of {key!r}, extended")
        return Call(self._renew, 1, [self._keys(key)[1], token, str(_ms(lease)), attempt], bool, what)

    def _finish_call(
        self, key: str, token: str, *, keep_queue: bool = False, attempt: str = ""
    ) -> Call[PendingCall | None]:
        items = [*self._keys(key)[:2], token, "1" if keep_queue else "0", attempt]
        return Call(self._finish, 2, items, pending_call)

    def _dequeue_call(self, key: str, token: str | None = None) -> Call[bool]:
        return Call(self._dequeue, 1, [self._keys(key)[0], token or ""], bool)

    def _reclaim_call(self, key: str, queue_token: str | None, run_token: str | None) -> Call[bool]:
        return Call(self._reclaim, 2, [*self._keys(key)[:2], queue_token or "", run_token or ""], bool)

    def _read_call(self, key: str) -> Call[LockState]:
        # Read at once, every field checked: a damaged record fails this call, not a later use.
        return Call(self._read, 3, names(self._prefix, key, _overlap.KEYS), partial(self._read_state, key))

    def _read_state(self, key: str, reply: Any) -> LockState:
        snapshot, _, pending = text(reply).partition("\n")  # and the pending run's host:pid, if any
        state = self._state(key, snapshot, now=True)
        state.pending_run = pending
        return state

    def overlap(self, key: str, token: str, mode: OverlapMode, *, lease: float, holder: Holder) -> Overlap:
        caller = f"{holder.host}:{holder.pid}"  # OVERLAP's ARGV: see _overlap
        items = [*names(self._prefix, key, _overlap.KEYS), token, mode[0], str(_ms(lease)), caller]
        return _overlap.REPLIES[int(self._eval(self._overlap, 3, items))]

    def claim(
        self,
        key: str,
        token: str,
        *,
        meta: QueueMeta,
        ttl: float | None = None,
        run: RunClaim | None = None,
        count: bool = False,
        counted: float | None = None,
        coalesce: Coalesce = "",
        debounce: Debounce | None = None,
    ) -> LockState | None:
        call = self._claim_call(key, token, meta=meta, ttl=ttl, run=run, count=count, counted=counted,
                                coalesce=coalesce, debounce=debounce)  # fmt: skip
        return self._done(call)

    def start(
        self,
        key: str,
        token: str,
        *,
        run: RunClaim,
        meta: QueueMeta,
        ttl: float | None = None,
        adopt: bool = False,
        queue_lock: QueueMode = "run",
        count: bool = False,
        counted: float | None = None,
    ) -> LockState | None:
        call = self._start_call(
            key, token, run=run, meta=meta, ttl=ttl, adopt=adopt, queue_lock=queue_lock,
            count=count, counted=counted,
        )  # fmt: skip
        return self._done(call)

    def attach(self, key: str, token: str, job_id: str) -> bool:
        return self._done(self._attach_call(key, token, job_id))

    def requeue(self, key: str, token: str, *, meta: QueueMeta, ttl: float | None, attempt: str = "") -> bool:
        return self._done(self._requeue_call(key, token, meta=meta, ttl=ttl, attempt=attempt))

    def renew(self, key: str, token: str, lease: float, attempt: str = "") -> bool:
        return self._done(self._renew_call(key, token, lease, attempt))

    def finish(
        self, key: str, token: str, *, keep_queue: bool = False, attempt: str = ""
    ) -> PendingCall | None:
        return self._done(self._finish_call(key, token, keep_queue=keep_queue, attempt=attempt))

    def dequeue(self, key: str, token: str | None = None) -> bool:
        return self._done(self._dequeue_call(key, token))

    def reclaim(self, key: str, queue_token: str | None, run_token: str | None) -> bool:
        return self._done(self._reclaim_call(key, queue_token, run_token))

    def read(self, key: str) -> LockState:
        return self._done(self._read_call(key))

    def read_many(self, keys: Sequence[str]) -> list[LockState | CorruptRecordError]:
        """Read ``keys`` as :meth:`read` does, their READ scripts sent together (``_wire.Wire.many``).

        A ``read`` of a subclass's own (or one set on the object) is honoured:
        then each key is read by it, one by one.
        """
        if getattr(self.read, "__func__", None) is not RedisBackend.read:
            return super().read_many(keys)
        calls = [self._read_call(key) for key in keys]  # the calls read() makes, sent together
        replies = self._call(partial(self._wire.many, self._read, 3, [call.items for call in calls]))
        return self._states(calls, replies)

    def _states(
        self, calls: list[Call[LockState]], replies: list[Any]
    ) -> list[LockState | CorruptRecordError]:
        """The states READ ``replies`` to ``calls`` describe; a damaged record's error in its place."""
        states: list[LockState | CorruptRecordError] = []
        for call, reply in zip(calls, replies, strict=True):
            try:
                if isinstance(reply, Exception):
                    raise self._failure(reply, call.items[: call.numkeys]) from reply
                states.append(call.decode(reply))
            except CorruptRecordError as exc:
                states.append(exc)
        return states

    def purge(self, key: str) -> list[str]:
        """Delete ``key``'s queue and run locks, whatever they hold; the Redis keys deleted.

        The key's last fence stays, so a later grant's fence is still greater.
        """
        names = self._keys(key)
        gone = self._eval(self._purge, 2, names[:2])
        return [name for bit, name in ((1, names[0]), (2, names[1])) if gone & bit]

    def scan(self) -> Iterator[str]:
        return _listing.lock_keys(self.client, self._prefix, self._call)

    def drops(self, window: float = WINDOW) -> Tally:
        """Sum the keys' ``<namespace>:{<key>}:d`` hashes (see ``_lua.count_drop``), found with ``SCAN``."""
        return _listing.drops(self.client, self._prefix, self._call, window)

    def namespaces(self, limit: int = 100_000) -> list[str]:
        """The namespaces holding locks on this server and database (this one too), sorted.

        A bounded look, for ``uniqjob locks`` to say where locks are when this
        namespace has none: SCAN stops once about ``limit`` keys were looked at.
        """
        return _listing.namespaces(self.client, self._call, limit)

    def close(self) -> None:
        self._call(self.client.close)


def _drop(count: bool, counted: float | None) -> str:
    """The drop that CLAIM's mode and START's flags end with: see ``_lua.count_drop``."""
    if counted is not None:
        return f"={minute(counted)}"
    return "+" if count else ""


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def from_url(url: str) -> RedisBackend:
    """A new RedisBackend for a Redis or Valkey URL of any form, checked first (see ``_url.parse``)."""
    spec = parse(url)
    backend = RedisBackend(
        client_for(spec),  # RedisBackend takes a cluster client too
        namespace=spec.namespace,
        replicas=spec.replicas,
        replica_timeout=spec.replica_timeout,
    )
    backend.name = spec.flavor  # "valkey" in the messages of a Valkey URL's store
    return backend
