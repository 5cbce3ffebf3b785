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

import json
from collections import namedtuple
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis
from redis.commands.core import Script

from ...errors import BackendError, CorruptRecordError
from ...locks import Holder
from ..semaphores import (
    HANDOFF,
    TOMBSTONE,
    Outcome,
    Park,
    ParkedInfo,
    Promotion,
    SemaphoreState,
    SemaphoreStore,
    SlotInfo,
    Via,
    decode_holder,
    encode_holder,
)
from . import _semaphore_lua as lua
from ._acks import Acks
from ._client import backend_error, is_response_error, key_of, match, names, scan_pages, where
from ._prelude import CORRUPT
from ._transport import Lanes, Scripts

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["RedisSemaphores"]

T = TypeVar("T")


_PARTS = ("slots", "parked", "entries", "waiters", "meta", "done")
_TYPES = ("hash", "list", "hash", "zset", "hash", "zset")  # what each of _PARTS must be
_STATES = frozenset({"reserved", "promoted", "running"})
_VIAS = frozenset({"queue", "inline"})
_NUMBER = (int, float)
# The statuses by which a step granted its own token a slot (see RedisSemaphores._granting).
_TAKEN, _RUN, _OK, _NONE = frozenset({"taken"}), frozenset({"run"}), frozenset({"ok"}), frozenset[str]()


class _Malformed(Exception):
    """A record read back from Redis has the wrong shape; turned into a CorruptRecordError naming it."""

    def __init__(self, part: int, reason: str) -> None:
        super().__init__(reason)
        self.part = part  # index into _PARTS
        self.reason = reason


def _text(value: Any) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


# The scripts' replies, by name: each is the array its script's head in _semaphore_lua states
# ("Returns {...}", and "a promotion is {...}"), field for field (tests/test_redis_semaphores.py
# holds the two in step).
_Promoted = namedtuple("_Promoted", "token via payload redo")
_Acquired = namedtuple("_Acquired", "status promotions position slots now_ms")
_Started = namedtuple("_Started", "status promotions position busy")
_Settled = namedtuple("_Settled", "status promotions")
_Counted = namedtuple("_Counted", "count promotions")
_Read = namedtuple("_Read", "now_ms meta slots parked head entries")

#: The reply of each script that answers with an array, read by these names.
REPLIES: dict[str, type[tuple[Any, ...]]] = {
    "ACQUIRE": _Acquired, "START": _Started, "RENEW": _Settled, "RELEASE": _Settled,
    "REQUEUE": _Settled, "REAP": _Counted, "DROP": _Counted, "READ": _Read,
}  # fmt: skip


def _promotions(flat: Sequence[Any]) -> tuple[Promotion, ...]:
    out = []
    for p in map(_Promoted._make, flat):
        via: Via = "inline" if _text(p.via) == "inline" else "queue"
        out.append(Promotion(_text(p.token), via, _text(p.payload), int(p.redo)))
    return tuple(out)


def _settled(reply: _Settled) -> Outcome:
    return Outcome(_text(reply.status), _promotions(reply.promotions))  # type: ignore[arg-type]


def _counted(reply: _Counted) -> Outcome:
    return Outcome("ok", _promotions(reply.promotions), count=int(reply.count))


def _record(part: int, what: str, raw: Any, texts: Sequence[str], numbers: Sequence[str]) -> dict[str, Any]:
    """Parse one JSON record of ``_PARTS[part]``, checking that its fields have their types."""
    try:
        data = json.loads(_text(raw))
    except ValueError:
        raise _Malformed(part, f"{what} is not JSON") from None
    if not isinstance(data, dict):
        raise _Malformed(part, f"{what} is not a JSON object")
    for name in texts:
        if not isinstance(data.get(name), str):
            raise _Malformed(part, f"{what}: field {name} is missing or not text")
    for name in numbers:
        value = data.get(name)
        if not isinstance(value, _NUMBER) or isinstance(value, bool):
            raise _Malformed(part, f"{what}: field {name} is missing or not a number")
    if data.get("via") not in _VIAS:
        raise _Malformed(part, f"{what}: unknown via {data.get('via')!r}")
    return data


def _holder(part: int, what: str, text: str) -> Holder | None:
    try:
        return decode_holder(text)
    except (ValueError, TypeError):
        raise _Malformed(part, f"{what}: holder {text!r} is not a holder") from None


def _slots(flat: Sequence[Any], now_ms: int) -> tuple[SlotInfo, ...]:
    out = []
    for i in range(0, len(flat), 2):
        token = _text(flat[i])
        what = f"slot {token}"
        s = _record(0, what, flat[i + 1], ("st", "via", "h", "args"), ("dl", "ls", "since", "redo"))
        if s["st"] not in _STATES:
            raise _Malformed(0, f"{what}: unknown status {s['st']!r}")
        if s["redo"] != int(s["redo"]):
            raise _Malformed(0, f"{what}: field redo is not whole")
        out.append(
            SlotInfo(
                token=token,
                status=s["st"],
                via=s["via"],
                holder=_holder(0, what, s["h"]),
                since=s["since"] / 1000,
                lease=s["ls"] / 1000,
                lease_left=(s["dl"] - now_ms) / 1000,
                redo=int(s["redo"]),
                args=s["args"],
            )
        )
    return tuple(out)


def _parked(token: str, raw: Any) -> ParkedInfo:
    what = f"parked call {token}"
    e = _record(2, what, raw, ("via", "h", "args"), ("since",))
    return ParkedInfo(token, e["via"], _holder(2, what, e["h"]), e["since"] / 1000, e["args"])


class RedisSemaphores(SemaphoreStore):
    """Semaphores in Redis under ``<namespace>:c:``; ``client`` is a redis-py client.

    The scripts are called through ``_transport.Scripts``: on ``lanes`` (the
    kept connections of the lock store on the same client) if given, else on
    the client's own if it fits, else through the client.
    """

    name = "redis"

    def __init__(
        self,
        client: Client,
        *,
        namespace: str = "uniqjob",
        lanes: Lanes | None = None,
        replicas: int = 0,
        replica_timeout: float = 1.0,
    ) -> None:
        self.client = cast("redis.Redis", client)  # a cluster client answers the same commands
        self.namespace = namespace
        self._prefix = f"{namespace}:c:"
        self._scripts = Scripts(client, lanes)
        # replicas > 0: every grant of a slot waits for that many replicas (see _acks), as the lock store's
        self._acks = Acks(self._scripts, replicas, replica_timeout) if replicas else None
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
        """A script's error: a corrupt record by name if a record caused it, else a BackendError."""
        message = str(exc)
        if message.startswith(CORRUPT):  # halt() in _prelude: the part, a space, the reason, a tab
            part, _, rest = message[len(CORRUPT) :].partition(" ")
            reason = rest.rpartition("\t")[0] or rest
            if part.isdigit() and 1 <= int(part) <= len(_PARTS):
                return self._corrupt(key, int(part) - 1, reason)
        if message.startswith("WRONGTYPE"):
            found = self._wrong_type(key)
            if found is not None:
                return found
        return self._failed(exc)

    def _wrong_type(self, key: str) -> CorruptRecordError | None:
        """Name the structure of ``key`` that holds the wrong kind of value; None if none does (now)."""
        names = self._keys(key)
        try:
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.type(name)
            kinds = [_text(kind) for kind in pipe.execute()]
        except Exception:
            return None
        for part, (kind, expected) in enumerate(zip(kinds, _TYPES, strict=True)):
            if kind not in ("none", expected):
                return self._corrupt(key, part, f"holds a {kind}, not a {expected}")
        return None

    @contextmanager
    def _reading(self, key: str) -> Iterator[None]:
        """Turn a malformed record met while reading a script's reply into a CorruptRecordError."""
        try:
            yield
        except _Malformed as bad:
            raise self._corrupt(key, bad.part, bad.reason) from None

    def _eval(self, script: Script, key: str, args: Sequence[Any]) -> Any:
        try:
            return self._scripts.call(script, len(_PARTS), [*self._keys(key), *args])
        except Exception as exc:  # an error reply of redis-py's or valkey-py's may name a record
            raise (self._explain(key, exc) if is_response_error(exc) else self._failed(exc)) from exc

    def _granting(
        self,
        script: Script,
        key: str,
        args: Sequence[Any],
        own: frozenset[str],
        caller: Holder,
        *,
        renew: bool = False,
    ) -> Any:
        """Run a script whose reply is ``[status, promotions, ...]``; with ``replicas``, acknowledged.

        What it granted: the slot of its token (``args[0]``) if the status is in
        ``own`` (with ``renew``: the slot's longer lease), and a slot to each
        call it promoted. Too few replicas acknowledged: the call fails closed,
        after the token's granted slot is released (token-checked; what that
        release promotes, like the promotions of this reply, is not handed out:
        each is pushed again once its handoff lapses). A lease extended is not
        undone, only not confirmed.
        """
        acks = self._acks
        if acks is None:
            return self._eval(script, key, args)
        try:
            reply, acked = acks.run(script, len(_PARTS), [*self._keys(key), *args])
        except redis.ResponseError as exc:
            raise self._explain(key, exc) from exc
        except Exception as exc:
            raise self._failed(exc) from exc
        mine = _text(reply[0]) in own
        promoted = len(reply[1])
        if mine or promoted:
            token = args[0]
            granted = [f"the {'lease of the ' if renew else ''}slot of {token}"] if mine else []
            granted += [f"{promoted} promoted call{'s' if promoted > 1 else ''}"] if promoted else []
            undo = partial(self._release_token, key, token, caller) if mine and not renew else None
            acks.check(acked, f"{' and '.join(granted)} of {key!r}, granted", undo, self, self.name)
        return reply

    def _release_token(self, key: str, token: str, caller: Holder) -> None:
        """Free ``token``'s slot: the undo of a grant too few replicas acknowledged."""
        self._eval(self._release, key, [token, encode_holder(caller), _ms(HANDOFF), _ms(TOMBSTONE)])

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
        argv = [
            token, limit, _ms(lease), "1" if running else "0", encode_holder(holder),
            park.via if park else "", park.payload if park else "",
            encode_holder(park.holder if park else None), _ms(park.lease) if park and park.lease else 0,
            job_class, args, encode_holder(caller), _ms(handoff),
        ]  # fmt: skip
        reply = _Acquired._make(self._granting(self._acquire, key, argv, _TAKEN, caller))
        with self._reading(key):
            slots = _slots(reply.slots, int(reply.now_ms))
        return Outcome(
            _text(reply.status),  # type: ignore[arg-type]
            _promotions(reply.promotions),
            position=int(reply.position),
            slots=slots,
        )

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
        argv = [
            token,
            encode_holder(holder),
            _ms(lease),
            encode_holder(takeover),
            encode_holder(caller),
            _ms(handoff),
        ]
        reply = _Started._make(self._granting(self._start, key, argv, _RUN, caller))
        with self._reading(key):
            runner = _holder(0, f"slot {token}", _text(reply.busy))
        return Outcome(
            _text(reply.status),  # type: ignore[arg-type]
            _promotions(reply.promotions),
            position=int(reply.position),
            holder=runner,
        )

    def renew(
        self, key: str, token: str, lease: float, *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        argv = [token, _ms(lease), encode_holder(caller), _ms(handoff)]
        return _settled(_Settled._make(self._granting(self._renew, key, argv, _OK, caller, renew=True)))

    def release(self, key: str, token: str, *, caller: Holder, handoff: float = HANDOFF) -> Outcome:
        argv = [token, encode_holder(caller), _ms(handoff), _ms(TOMBSTONE)]
        return _settled(_Settled._make(self._granting(self._release, key, argv, _NONE, caller)))

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
        argv = [token, _ms(lease), encode_holder(holder), encode_holder(caller), _ms(handoff)]
        return _settled(_Settled._make(self._eval(self._requeue, key, argv)))

    def handed(self, key: str, token: str, promoter: Holder) -> bool:
        return bool(self._eval(self._handed, key, [token, encode_holder(promoter)]))

    def withdraw(self, key: str, token: str) -> Outcome:
        return Outcome(_text(self._eval(self._withdraw, key, [token])))  # type: ignore[arg-type]

    def reap(
        self, key: str, dead: Sequence[tuple[str, Holder]], *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        argv: list[Any] = [encode_holder(caller), _ms(handoff)]
        for token, holder in dead:
            argv += [token, encode_holder(holder)]
        return _counted(_Counted._make(self._eval(self._reap, key, argv)))

    def discard_parked(self, key: str) -> list[tuple[str, str]]:
        flat = self._eval(self._discard, key, [])
        return [(_text(flat[i]), _text(flat[i + 1])) for i in range(0, len(flat), 2)]

    def drop(self, key: str, tokens: Sequence[str], *, caller: Holder, handoff: float = HANDOFF) -> Outcome:
        argv = [encode_holder(caller), _ms(handoff), *tokens]
        return _counted(_Counted._make(self._eval(self._drop, key, argv)))

    def read(self, key: str, *, head: int = 5) -> SemaphoreState:
        reply = _Read._make(self._eval(self._read, key, [head]))
        flat = reply.meta
        meta = {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}
        with self._reading(key):
            limit = meta.get("limit", "1")
            if not limit.isdigit():
                raise _Malformed(4, f"field limit is {limit!r}, not a whole number")
            infos = [
                _parked(_text(token), raw)
                for token, raw in zip(reply.head, reply.entries, strict=True)
                if raw
            ]
            slots = _slots(reply.slots, int(reply.now_ms))
        return SemaphoreState(
            key=key,
            limit=int(limit),
            job_class=meta.get("cls", ""),
            slots=slots,
            parked=int(reply.parked),
            head=tuple(infos),
            now=int(reply.now_ms) / 1000,
        )

    def scan(self) -> Iterator[str]:
        # Every primary of a cluster, a page at a time; a key is listed once, however often it is met.
        prefix = self._prefix
        pages = self._call(partial(scan_pages, self.client, match(prefix, "meta"), 1000))
        seen: set[str] = set()
        while True:
            page = self._call(partial(next, pages, None))
            if page is None:
                return
            for name in page:
                key = key_of(prefix, name, "meta")
                if key is not None and key not in seen:
                    seen.add(key)
                    yield key
