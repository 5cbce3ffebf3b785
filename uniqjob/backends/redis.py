"""RedisBackend: locks in Redis, for many hosts.

Each primitive is one Lua script, so one round trip and one atomic step. The
scripts read the server's clock (``TIME``), never the client's. Both locks of a
key share a hash tag, ``<namespace>:{<key>}:q`` and ``...:r``, so every script
touches one cluster slot. Listing uses ``SCAN``, never ``KEYS``.

The scripts are called on a connection each thread keeps (``_wire.Lanes``),
not through ``execute_command``, whose own Python is a sixth of a round trip
on loopback; a success is the integer 1, so the common reply is the cheapest.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeVar

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from ..errors import BackendError, ConfigurationError
from ..locks import QUEUED, RUNNING, Holder, LockState, Parts, QueueMeta, QueueRecord, RunClaim, RunRecord
from . import _redis_lua as lua
from ._wire import Lanes, evalsha_head, pack_after
from .base import Backend, QueueMode

__all__ = ["RedisBackend"]

T = TypeVar("T")

_QUEUE_MODES: dict[QueueMode, str] = {"run": "r", "release": "x", "keep": "k"}
_QUIET = (b"Q", "Q")  # the mark of a snapshot that need not be read: see _redis_lua's snapshot()


# The C scanner itself: JSONDecoder.decode adds two Python calls and a regex for whitespace.
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _text(value: Any) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


class RedisBackend(Backend):
    """Locks in Redis, shared by every host that talks to the same server.

    ``client`` is a redis-py client (``decode_responses`` on or off) or a URL
    (``redis://``, ``rediss://``, ``unix://``). A URL gets bounded socket
    timeouts (``timeout`` seconds), so an unreachable server fails the call
    with :class:`BackendError` in bounded time; the job is then not run.

    Each thread that uses the backend keeps one connection of the client's
    kind and settings (a plain ``ConnectionPool``; other pools are used as
    they are); :meth:`close` closes them with the client's pool.
    """

    name = "redis"

    def __init__(
        self,
        client: redis.Redis | str,
        *,
        namespace: str = "uniqjob",
        timeout: float = 5.0,
    ) -> None:
        if isinstance(client, str):
            try:
                client = redis.Redis.from_url(client, socket_timeout=timeout, socket_connect_timeout=timeout)
            except ValueError as exc:
                raise ConfigurationError(f"bad Redis URL {client!r}: {exc}") from exc
        self.client: redis.Redis = client
        self._execute: Callable[..., Any] = client.execute_command
        self._lanes = Lanes(client) if Lanes.fit(client) else None
        self._heads: dict[tuple[Any, int, int], bytes] = {}
        self._holder: tuple[Holder | None, list[str]] = (None, [])
        self.namespace = namespace
        self._prefix = namespace + ":{"
        self._claim = self._script(lua.CLAIM)
        self._start = self._script(lua.START)
        self._renew = self._script(lua.RENEW)
        self._attach = self._script(lua.ATTACH)
        self._requeue = self._script(lua.REQUEUE)
        self._finish = self._script(lua.FINISH)
        self._dequeue = self._script(lua.DEQUEUE)
        self._reclaim = self._script(lua.RECLAIM)
        self._read = self._script(lua.READ)

    def __repr__(self) -> str:
        kwargs = self.client.connection_pool.connection_kwargs
        where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        return f"RedisBackend({where!r}, db={kwargs.get('db', 0)})"

    def _script(self, source: str) -> Script:
        return self.client.register_script(source)

    def _keys(self, key: str) -> list[str]:
        base = self._prefix + key
        return [base + "}:q", base + "}:r"]

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except redis.RedisError as exc:
            raise BackendError(f"{exc} ({self!r})", self.name) from exc

    def _eval(self, script: Script, numkeys: int, items: list[Any]) -> Any:
        """Run ``script`` with ``items``: its ``numkeys`` keys, then its arguments."""
        try:
            lanes = self._lanes
            if lanes is None:
                return self._eval_pooled(script, numkeys, items)
            head = self._heads.get((script.sha, numkeys, len(items))) or self._head(
                script, numkeys, len(items)
            )
            try:
                return lanes.call(pack_after(head, items, lanes.encoding, lanes.errors))
            except NoScriptError:  # the server lost its script cache (restart, SCRIPT FLUSH)
                script.sha = self.client.script_load(script.script)
                head = self._head(script, numkeys, len(items))
                return lanes.call(pack_after(head, items, lanes.encoding, lanes.errors))
        except redis.RedisError as exc:
            raise BackendError(f"{exc} ({self!r})", self.name) from exc

    def _head(self, script: Script, numkeys: int, count: int) -> bytes:
        head = self._heads[(script.sha, numkeys, count)] = evalsha_head(script.sha, numkeys, count)
        return head

    def _eval_pooled(self, script: Script, numkeys: int, items: list[Any]) -> Any:
        # EVALSHA straight through execute_command: Script.__call__ costs as much
        # again in Python (an import, tuple copies, two more layers) on every call.
        try:
            return self._execute("EVALSHA", script.sha, numkeys, *items)
        except NoScriptError:
            script.sha = self.client.script_load(script.script)
            return self._execute("EVALSHA", script.sha, numkeys, *items)

    def _state(self, key: str, reply: str | bytes) -> LockState:
        """The state a script's snapshot reply describes; the usual duplicate's ("Q"), unread until used."""
        if reply[:1] in _QUIET:
            return LockState.unread(key, partial(self._parts, key, reply), quiet=True)
        return LockState(key, *self._parts(key, reply))

    def _parts(self, key: str, reply: str | bytes) -> Parts:
        # (bytes decoded as json.loads would, minus its sniffing for UTF-16 and -32)
        try:
            text = reply.decode("utf-8", "surrogatepass") if isinstance(reply, bytes) else reply
            if text[:1] not in ("Q", "S"):
                raise ValueError("no mark")
            now, q, qttl, r, rttl = _scan_json(text, 1)[0]  # q, r: the fields named in _redis_lua
        except (StopIteration, ValueError) as exc:  # StopIteration: the scanner's "not JSON"
            raise BackendError(f"unreadable lock state from the server: {reply[:80]!r}", self.name) from exc
        queue = run = None
        if q:
            # A field that is not set comes as false. (Positional arguments: this runs on every conflict.)
            token, state, since, cls, cls_len, args, job_id = q
            if cls_len:
                cls = key[: int(cls_len)]
            ttl = int(qttl)
            queue = QueueRecord(
                token,
                RUNNING if state == "r" else QUEUED,
                int(since) / 1_000_000,
                QueueMeta(cls or "", args or "", job_id or ""),
                ttl / 1000 if ttl >= 0 else None,
            )
        if r:
            token, host, node, pid, pstart, started, lease = r
            run = RunRecord(
                token,
                Holder(host, node, int(pid), int(pstart)),
                int(started) / 1_000_000,
                int(lease) / 1000,
                max(int(rttl), 0) / 1000,
            )
        return queue, run, int(now) / 1_000_000

    def _items(
        self, key: str, token: str, meta: QueueMeta, ttl: float | None, *, flag: str, run: RunClaim | None
    ) -> list[Any]:
        """Both keys of ``key`` and what a claim or start says: see the ARGV of _redis_lua.CLAIM."""
        cls, cls_len = meta.cls, ""
        if cls and key.startswith(cls):
            cls, cls_len = "", str(len(cls))  # the key already holds it
        ttl_ms = str(_ms(ttl)) if ttl else "0"  # text: the encoder's quickest case
        items = [*self._keys(key), token, ttl_ms, cls, cls_len, meta.args, meta.job_id, flag]
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

    def claim(
        self,
        key: str,
        token: str,
        *,
        meta: QueueMeta,
        ttl: float | None = None,
        run: RunClaim | None = None,
    ) -> LockState | None:
        items = self._items(key, token, meta, ttl, flag="q" if run is None else "r", run=run)
        reply = self._eval(self._claim, 2, items)
        return None if reply == 1 else self._state(key, reply)

    def start(
        self,
        key: str,
        token: str,
        *,
        run: RunClaim,
        meta: QueueMeta,
        ttl: float | None = None,
        adopt: bool = False,
        queue: QueueMode = "run",
    ) -> LockState | None:
        flags = ("a" if adopt else "-") + _QUEUE_MODES[queue]
        reply = self._eval(self._start, 2, self._items(key, token, meta, ttl, flag=flags, run=run))
        return None if reply == 1 else self._state(key, reply)

    def attach(self, key: str, token: str, job_id: str) -> bool:
        return bool(self._eval(self._attach, 1, [self._keys(key)[0], token, job_id]))

    def requeue(self, key: str, token: str, *, meta: QueueMeta, ttl: float | None) -> bool:
        items = self._items(key, token, meta, ttl, flag="", run=None)[:8]
        return bool(self._eval(self._requeue, 2, items))

    def renew(self, key: str, token: str, lease: float) -> bool:
        return bool(self._eval(self._renew, 1, [self._keys(key)[1], token, _ms(lease)]))

    def finish(self, key: str, token: str, *, keep_queue: bool = False) -> None:
        self._eval(self._finish, 2, [*self._keys(key), token, "1" if keep_queue else "0"])

    def dequeue(self, key: str, token: str | None = None) -> bool:
        return bool(self._eval(self._dequeue, 1, [self._keys(key)[0], token or ""]))

    def reclaim(self, key: str, queue_token: str | None, run_token: str | None) -> bool:
        return bool(self._eval(self._reclaim, 2, [*self._keys(key), queue_token or "", run_token or ""]))

    def read(self, key: str) -> LockState:
        return self._state(key, self._eval(self._read, 2, self._keys(key)))

    def scan(self) -> Iterator[str]:
        head = len(self.namespace) + 2  # "<namespace>:{"
        match = f"{self.namespace}:{{*}}:[qr]"
        cursor: int = 0
        while True:
            cursor, page = self._call(partial(self.client.scan, cursor, match=match, count=1000))
            names = [_text(n) for n in page]
            queued = {n[:-2] for n in names if n.endswith(":q")}
            # A run lock whose queue lock autoexpired is still a held key.
            lone = [n[:-2] for n in names if n.endswith(":r") and n[:-2] not in queued]
            if lone:
                pipe = self.client.pipeline(transaction=False)
                for base in lone:
                    pipe.exists(base + ":q")
                exists = self._call(pipe.execute)
                queued.update(base for base, e in zip(lone, exists, strict=True) if not e)
            for base in queued:
                yield base[head:-1]
            if int(cursor) == 0:
                return

    def close(self) -> None:
        if self._lanes is not None:
            self._lanes.close()
        self.client.close()


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
