"""Semaphores in Redis, for many hosts: each primitive is one Lua script, on the server's clock.

A key's six structures share the hash tag ``{<key>}`` under ``<namespace>:c:``,
apart from the uniqueness locks' key space, so every script touches one
cluster slot::

    <ns>:c:{K}:slots    hash   token -> slot (JSON)
    <ns>:c:{K}:parked   list   tokens, oldest first
    <ns>:c:{K}:entries  hash   token -> parked call (JSON)
    <ns>:c:{K}:waiters  zset   inline waiters' tokens by deadline (queue entries have none)
    <ns>:c:{K}:meta     hash   limit, cls (exists while anything is held or parked; SCAN finds keys by it)
    <ns>:c:{K}:done     zset   tokens released after a second push, by expiry

Times inside are integer milliseconds of the server's ``TIME``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

import redis
from redis.commands.core import Script

from ..errors import BackendError
from ..locks import Holder
from . import _lua as lua
from .base import (
    HANDOFF,
    TOMBSTONE,
    Outcome,
    Park,
    ParkedInfo,
    Promotion,
    SemaphoreState,
    SemaphoreStore,
    SlotInfo,
    decode_holder,
    encode_holder,
)

__all__ = ["RedisSemaphores"]

T = TypeVar("T")


def _text(value: Any) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _promotions(flat: Sequence[Any]) -> tuple[Promotion, ...]:
    out = []
    for token, via, payload, redo in flat:
        via_text = _text(via)
        out.append(
            Promotion(_text(token), "inline" if via_text == "inline" else "queue", _text(payload), int(redo))
        )
    return tuple(out)


def _slots(flat: Sequence[Any], now_ms: int) -> tuple[SlotInfo, ...]:
    out = []
    for i in range(0, len(flat), 2):
        s = json.loads(_text(flat[i + 1]))
        out.append(
            SlotInfo(
                token=_text(flat[i]),
                status=s["st"],
                via=s["via"],
                holder=decode_holder(s["h"]),
                since=s["since"] / 1000,
                lease=s["ls"] / 1000,
                lease_left=(s["dl"] - now_ms) / 1000,
                redo=int(s["redo"]),
                args=s["args"],
            )
        )
    return tuple(out)


class RedisSemaphores(SemaphoreStore):
    """Semaphores in Redis under ``<namespace>:c:``; ``client`` is a redis-py client."""

    name = "redis"

    def __init__(self, client: redis.Redis, *, namespace: str = "uniqjob") -> None:
        self.client = client
        self.namespace = namespace
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
        kwargs = self.client.connection_pool.connection_kwargs
        where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        return f"RedisSemaphores({where!r}, namespace={self.namespace!r})"

    def _keys(self, key: str) -> list[str]:
        base = f"{self.namespace}:c:{{{key}}}:"
        return [base + part for part in ("slots", "parked", "entries", "waiters", "meta", "done")]

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except redis.RedisError as exc:
            raise BackendError(f"{exc} ({self!r})", self.name) from exc

    def _eval(self, script: Script, key: str, args: Sequence[Any]) -> Any:
        return self._call(lambda: script(keys=self._keys(key), args=list(args)))

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
        status, promos, position, flat, now_ms = self._eval(self._acquire, key, argv)
        return Outcome(
            _text(status),  # type: ignore[arg-type]
            _promotions(promos),
            position=int(position),
            slots=_slots(flat, int(now_ms)),
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
        status, promos, position, busy = self._eval(self._start, key, argv)
        return Outcome(
            _text(status),  # type: ignore[arg-type]
            _promotions(promos),
            position=int(position),
            holder=decode_holder(_text(busy)),
        )

    def renew(
        self, key: str, token: str, lease: float, *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        status, promos = self._eval(
            self._renew, key, [token, _ms(lease), encode_holder(caller), _ms(handoff)]
        )
        return Outcome(_text(status), _promotions(promos))  # type: ignore[arg-type]

    def release(self, key: str, token: str, *, caller: Holder, handoff: float = HANDOFF) -> Outcome:
        argv = [token, encode_holder(caller), _ms(handoff), _ms(TOMBSTONE)]
        status, promos = self._eval(self._release, key, argv)
        return Outcome(_text(status), _promotions(promos))  # type: ignore[arg-type]

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
        status, promos = self._eval(self._requeue, key, argv)
        return Outcome(_text(status), _promotions(promos))  # type: ignore[arg-type]

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
        count, promos = self._eval(self._reap, key, argv)
        return Outcome("ok", _promotions(promos), count=int(count))

    def discard_parked(self, key: str) -> list[tuple[str, str]]:
        flat = self._eval(self._discard, key, [])
        return [(_text(flat[i]), _text(flat[i + 1])) for i in range(0, len(flat), 2)]

    def drop(self, key: str, tokens: Sequence[str], *, caller: Holder, handoff: float = HANDOFF) -> Outcome:
        count, promos = self._eval(self._drop, key, [encode_holder(caller), _ms(handoff), *tokens])
        return Outcome("ok", _promotions(promos), count=int(count))

    def read(self, key: str, *, head: int = 5) -> SemaphoreState:
        now_ms, meta_flat, slot_flat, parked, tokens, entries = self._eval(self._read, key, [head])
        meta = {_text(meta_flat[i]): _text(meta_flat[i + 1]) for i in range(0, len(meta_flat), 2)}
        infos = []
        for token, raw in zip(tokens, entries, strict=True):
            if not raw:
                continue
            e = json.loads(_text(raw))
            infos.append(
                ParkedInfo(_text(token), e["via"], decode_holder(e["h"]), e["since"] / 1000, e["args"])
            )
        return SemaphoreState(
            key=key,
            limit=int(meta.get("limit", "1")),
            job_class=meta.get("cls", ""),
            slots=_slots(slot_flat, int(now_ms)),
            parked=int(parked),
            head=tuple(infos),
            now=int(now_ms) / 1000,
        )

    def scan(self) -> Iterator[str]:
        head = len(self.namespace) + 4  # "<namespace>:c:{"
        tail = len("}:meta")
        match = f"{self.namespace}:c:{{*}}:meta"
        cursor: int = 0
        while True:
            cursor, page = self._call(partial(self.client.scan, cursor, match=match, count=1000))
            for name in page:
                yield _text(name)[head:-tail]
            if int(cursor) == 0:
                return
