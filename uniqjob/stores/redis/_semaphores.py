"""Semaphores in Redis, for many hosts: each primitive is one Lua script, on the server's clock.

A key's six structures share the hash tag ``{<key>}`` under ``<namespace>:c:``,
apart from the uniqueness locks' key space, so every script touches one
cluster slot (a key that starts with ``}`` is named another way: ``_client.names``)::

    <ns>:c:{K}:slots    hash   token -> slot (JSON)
    <ns>:c:{K}:parked   list   tokens, oldest first
    <ns>:c:{K}:entries  hash   token -> parked call (JSON)
    <ns>:c:{K}:waiters  zset   inline waiters' tokens by deadline (queue entries have none)
    <ns>:c:{K}:meta     hash   limit, cls (exists while anything is held or parked; SCAN finds keys by it)
    <ns>:c:{K}:done     zset   tokens released after a second push, by expiry

Times inside are integer milliseconds of the server's ``TIME`` (the scripts' shared
``clock()`` is in microseconds; they store ``ms(clock())``, the unit 0.3.0 stored).

Every record is checked as it is read, by the scripts and again here: a field
of the wrong type, a record that is not JSON, or a structure of the wrong kind
is a :class:`~uniqjob.errors.CorruptRecordError` naming its Redis key, never
a Lua error or a TypeError. Any other exception from the client (a cluster
client, a valkey client, a bug in a wire path) is a
:class:`~uniqjob.errors.BackendError` carrying it as its cause.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar, cast

import redis
from redis.commands.core import Script

from ...errors import BackendError, CorruptRecordError
from ...locks import Holder
from ..semaphores import HANDOFF, TOMBSTONE, Outcome, Park, SemaphoreState, SemaphoreStore, encode_holder
from . import _listing
from . import _replies as replies
from . import _semaphore_lua as lua
from ._acks import Acks
from ._client import backend_error, is_response_error, names, where
from ._lua import corrupt_reply
from ._url import check_store_options
from ._wire import Wire, text

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["RedisSemaphores", "SemCall"]

T = TypeVar("T")

_PARTS = ("slots", "parked", "entries", "waiters", "meta", "done")
_TYPES = ("hash", "list", "hash", "zset", "hash", "zset")  # what each of _PARTS must be
# The statuses by which a step granted its own token a slot (see RedisSemaphores._granting).
_TAKEN, _RUN, _OK, _NONE = frozenset({"taken"}), frozenset({"run"}), frozenset({"ok"}), frozenset[str]()


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class SemCall(NamedTuple, Generic[T]):
    """One semaphore primitive's script call on ``key``: its arguments after the keys, and its reply's reader.

    ``shape`` names the fields of an array reply; ``own`` (with ``caller``, for a
    primitive whose grants replicas must acknowledge) the statuses by which it
    granted its token a slot (see ``RedisSemaphores._granting``).
    """

    script: Script
    key: str
    argv: list[Any]
    decode: Callable[[Any], T]
    shape: type[tuple[Any, ...]] = tuple
    own: frozenset[str] | None = None
    caller: Holder | None = None
    renew: bool = False


class RedisSemaphores(SemaphoreStore):
    """Semaphores in Redis under ``<namespace>:c:``; ``client`` is a redis-py client.

    The scripts are called through ``_wire.Wire``: the client's ``evalsha``
    and pipelines.
    """

    name = "redis"

    def __init__(
        self,
        client: Client,
        *,
        namespace: str = "uniqjob",
        replicas: int = 0,
        replica_timeout: float = 1.0,
    ) -> None:
        check_store_options(namespace, replicas)
        self.client = cast("redis.Redis", client)  # a cluster client answers the same commands
        self.namespace = namespace
        self._prefix = f"{namespace}:c:"
        self._wire = Wire(client)
        # replicas > 0: every grant of a slot waits for that many replicas (see _acks), as the lock store's
        self._acks = Acks(self._wire, replicas, replica_timeout) if replicas else None
        register = client.register_script
        self._acquire = register(lua.ACQUIRE)
        self._start = register(lua.START)
        self._renew = register(lua.RENEW)
        self._release = register(lua.RELEASE)
        self._requeue = register(lua.REQUEUE)
        self._handed = register(lua.HANDED)
        self._withdraw = register(lua.WITHDRAW)
        self._reap = register(lua.REAP)
        self._discard = register(lua.DISCARD)
        self._drop = register(lua.DROP)
        self._read = register(lua.READ)

    def __repr__(self) -> str:
        return f"RedisSemaphores({where(self.client)}, namespace={self.namespace!r})"

    def _keys(self, key: str) -> list[str]:
        return names(self._prefix, key, _PARTS)

    def _failed(self, exc: Exception) -> BackendError:
        """Any exception from the client, as the BackendError that callers are promised."""
        return backend_error(exc, self, self.name)

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except Exception as exc:  # a cluster or valkey client, a bug in a wire path: all BackendErrors
            raise self._failed(exc) from exc

    def _corrupt(self, key: str, part: int, reason: str) -> CorruptRecordError:
        return CorruptRecordError(self._keys(key)[part], reason, key=key, backend=self.name)

    def _explain(self, key: str, exc: Exception) -> BackendError:
        """What a caller sees for a script that raised ``exc``: an error reply of redis-py's or
        valkey-py's that a record caused is a CorruptRecordError naming it; anything else a BackendError."""
        if not is_response_error(exc):
            return self._failed(exc)
        found = corrupt_reply(exc, len(_PARTS))  # halt() in _lua.CHECKS
        if found is not None:
            return self._corrupt(key, *found)
        if str(exc).startswith("WRONGTYPE"):
            wrong = self._wrong_type(key)
            if wrong is not None:
                return wrong
        return self._failed(exc)

    def _wrong_type(self, key: str) -> CorruptRecordError | None:
        """Name the structure of ``key`` that holds the wrong kind of value; None if none does (now)."""
        try:
            pipe = self.client.pipeline(transaction=False)
            for name in self._keys(key):
                pipe.type(name)
            kinds = [text(kind) for kind in pipe.execute()]
        except Exception:
            return None
        for part, (kind, expected) in enumerate(zip(kinds, _TYPES, strict=True)):
            if kind not in ("none", expected):
                return self._corrupt(key, part, f"holds a {kind}, not a {expected}")
        return None

    def _eval(self, script: Script, key: str, args: Sequence[Any]) -> Any:
        try:
            return self._wire.call(script, len(_PARTS), [*self._keys(key), *args])
        except Exception as exc:
            raise self._explain(key, exc) from exc

    def _granting(self, call: SemCall[Any]) -> Any:
        """Run ``call`` (its reply ``[status, promotions, ...]``); with ``replicas``, acknowledged.

        What it granted: the slot of its token (``call.argv[0]``) if the status is in
        ``call.own`` (with ``call.renew``: the slot's longer lease), and a slot to each
        call it promoted. Too few replicas acknowledged: the call fails closed,
        after the token's granted slot is released (token-checked; what that
        release promotes, like the promotions of this reply, is not handed out:
        each is pushed again once its handoff lapses). A lease extended is not
        undone, only not confirmed.
        """
        acks, key, caller = self._acks, call.key, call.caller
        if acks is None or call.own is None or caller is None:
            return self._eval(call.script, key, call.argv)
        try:
            reply, acked = acks.wire.acked(
                call.script, len(_PARTS), [*self._keys(key), *call.argv], acks.wait
            )
        except Exception as exc:
            raise self._explain(key, exc) from exc
        named: Any = call.shape._make(reply)  # type: ignore[attr-defined]
        mine = text(named.status) in call.own
        promoted = len(named.promotions)
        if mine or promoted:
            token, renew = call.argv[0], call.renew
            granted = [f"the {'lease of the ' if renew else ''}slot of {token}"] if mine else []
            granted += [f"{promoted} promoted call{'s' if promoted > 1 else ''}"] if promoted else []
            # the undo: the token's slot freed, as a release frees it
            argv = [token, encode_holder(caller), _ms(HANDOFF), _ms(TOMBSTONE)]
            undo = partial(self._eval, self._release, key, argv) if mine and not renew else None
            what = f"{' and '.join(granted)} of {key!r}, granted"
            acks.confirm(acked, what, undo, self, self.name, name=self._keys(key)[0])
        return reply

    # Each primitive is a script call (:class:`SemCall`: what to send, and how to read the reply)
    # and its sending; the calls are the async face's too (_async_semaphores), only the sending differs.

    def decoded(self, call: SemCall[T], reply: Any) -> T:
        """``call``'s reply read, a malformed record in it a CorruptRecordError naming it."""
        try:
            return call.decode(reply)
        except replies.Malformed as bad:
            raise self._corrupt(call.key, bad.part, bad.reason) from None

    def _done(self, call: SemCall[T]) -> T:
        return self.decoded(call, self._granting(call))

    def _acquire_call(
        self,
        key: str,
        token: str,
        *,
        limit: int,
        lease: float,
        running: bool,
        holder: Holder | None,
        park: Park | None,
        job_class: str,
        args: str,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> SemCall[Outcome]:
        argv = [
            token, limit, _ms(lease), "1" if running else "0", encode_holder(holder),
            park.via if park else "", park.payload if park else "",
            encode_holder(park.holder if park else None), _ms(park.lease) if park and park.lease else 0,
            job_class, args, encode_holder(caller), _ms(handoff),
        ]  # fmt: skip
        return SemCall(self._acquire, key, argv, replies.acquired, replies.Acquired, _TAKEN, caller)

    def _start_call(
        self,
        key: str,
        token: str,
        *,
        holder: Holder,
        lease: float,
        takeover: Holder | None,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> SemCall[Outcome]:
        argv = [
            token, encode_holder(holder), _ms(lease), encode_holder(takeover), encode_holder(caller),
            _ms(handoff),
        ]  # fmt: skip
        decode = partial(replies.started, token)
        return SemCall(self._start, key, argv, decode, replies.Started, _RUN, caller)

    def _renew_call(
        self, key: str, token: str, lease: float, *, caller: Holder, handoff: float = HANDOFF
    ) -> SemCall[Outcome]:
        argv = [token, _ms(lease), encode_holder(caller), _ms(handoff)]
        return SemCall(self._renew, key, argv, replies.settled, replies.Settled, _OK, caller, renew=True)

    def _release_call(
        self, key: str, token: str, *, caller: Holder, handoff: float = HANDOFF
    ) -> SemCall[Outcome]:
        argv = [token, encode_holder(caller), _ms(handoff), _ms(TOMBSTONE)]
        return SemCall(self._release, key, argv, replies.settled, replies.Settled, _NONE, caller)

    def _requeue_call(
        self,
        key: str,
        token: str,
        lease: float,
        *,
        holder: Holder,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> SemCall[Outcome]:
        argv = [token, _ms(lease), encode_holder(holder), encode_holder(caller), _ms(handoff)]
        return SemCall(self._requeue, key, argv, replies.settled, replies.Settled)

    def _handed_call(self, key: str, token: str, promoter: Holder) -> SemCall[bool]:
        return SemCall(self._handed, key, [token, encode_holder(promoter)], bool)

    def _withdraw_call(self, key: str, token: str) -> SemCall[Outcome]:
        return SemCall(self._withdraw, key, [token], replies.withdrawn)

    def _reap_call(
        self, key: str, dead: Sequence[tuple[str, Holder]], *, caller: Holder, handoff: float = HANDOFF
    ) -> SemCall[Outcome]:
        argv: list[Any] = [encode_holder(caller), _ms(handoff)]
        for token, holder in dead:
            argv += [token, encode_holder(holder)]
        return SemCall(self._reap, key, argv, replies.counted, replies.Counted)

    def _discard_parked_call(self, key: str) -> SemCall[list[tuple[str, str]]]:
        return SemCall(self._discard, key, [], replies.pairs)

    def _drop_call(
        self, key: str, tokens: Sequence[str], *, caller: Holder, handoff: float = HANDOFF
    ) -> SemCall[Outcome]:
        argv = [encode_holder(caller), _ms(handoff), *tokens]
        return SemCall(self._drop, key, argv, replies.counted, replies.Counted)

    def _read_call(self, key: str, *, head: int = 5) -> SemCall[SemaphoreState]:
        return SemCall(self._read, key, [head], partial(replies.state, key))

    def acquire(
        self,
        key: str,
        token: str,
        *,
        limit: int,
        lease: float,
        running: bool,
        holder: Holder | None,
        park: Park | None,
        job_class: str,
        args: str,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> Outcome:
        return self._done(self._acquire_call(
            key, token, limit=limit, lease=lease, running=running, holder=holder, park=park,
            job_class=job_class, args=args, caller=caller, handoff=handoff,
        ))  # fmt: skip

    def start(
        self,
        key: str,
        token: str,
        *,
        holder: Holder,
        lease: float,
        takeover: Holder | None,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> Outcome:
        return self._done(self._start_call(
            key, token, holder=holder, lease=lease, takeover=takeover, caller=caller, handoff=handoff
        ))  # fmt: skip

    def renew(
        self, key: str, token: str, lease: float, *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        return self._done(self._renew_call(key, token, lease, caller=caller, handoff=handoff))

    def release(self, key: str, token: str, *, caller: Holder, handoff: float = HANDOFF) -> Outcome:
        return self._done(self._release_call(key, token, caller=caller, handoff=handoff))

    def requeue(
        self,
        key: str,
        token: str,
        lease: float,
        *,
        holder: Holder,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> Outcome:
        return self._done(
            self._requeue_call(key, token, lease, holder=holder, caller=caller, handoff=handoff)
        )

    def handed(self, key: str, token: str, promoter: Holder) -> bool:
        return self._done(self._handed_call(key, token, promoter))

    def withdraw(self, key: str, token: str) -> Outcome:
        return self._done(self._withdraw_call(key, token))

    def reap(
        self, key: str, dead: Sequence[tuple[str, Holder]], *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        return self._done(self._reap_call(key, dead, caller=caller, handoff=handoff))

    def discard_parked(self, key: str) -> list[tuple[str, str]]:
        return self._done(self._discard_parked_call(key))

    def drop(self, key: str, tokens: Sequence[str], *, caller: Holder, handoff: float = HANDOFF) -> Outcome:
        return self._done(self._drop_call(key, tokens, caller=caller, handoff=handoff))

    def read(self, key: str, *, head: int = 5) -> SemaphoreState:
        return self._done(self._read_call(key, head=head))

    def read_many(self, keys: Sequence[str], *, head: int = 5) -> list[SemaphoreState | CorruptRecordError]:
        """Read ``keys`` as :meth:`read` does, their READ scripts sent together (``_wire.Wire.many``).

        A ``read`` of a subclass's own (or one set on the object) is honoured:
        then each key is read by it, one by one.
        """
        if getattr(self.read, "__func__", None) is not RedisSemaphores.read:
            return super().read_many(keys, head=head)
        batch = [[*self._keys(key), head] for key in keys]
        answers = self._call(partial(self._wire.many, self._read, len(_PARTS), batch))
        states: list[SemaphoreState | CorruptRecordError] = []
        for key, reply in zip(keys, answers, strict=True):
            try:
                if isinstance(reply, Exception):
                    raise self._explain(key, reply) from reply
                states.append(self.decoded(self._read_call(key, head=head), reply))
            except CorruptRecordError as exc:
                states.append(exc)
        return states

    def scan(self) -> Iterator[str]:
        return _listing.semaphore_keys(self.client, self._prefix, self._call)
