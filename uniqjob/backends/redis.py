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
from ..locks import QUEUED, RUNNING, Holder, LockState, QueueMeta, QueueRecord, RunClaim, RunRecord
from ._wire import Lanes, evalsha_head, pack_after
from .base import Backend, QueueMode

__all__ = ["RedisBackend"]

T = TypeVar("T")

# Shared by every script. KEYS[1] is the queue lock (a hash), KEYS[2] the run lock.
# Every held lock is one small hash, so its bytes count: field names are one
# letter, empty fields are left out, and a class name that the key already
# starts with is kept as its length (the queue hash then fits a small listpack).
#   queue lock: t token, s state ('q' queued / 'r' running), a since (µs),
#               c class or n its length in the key, p arguments preview, j job id
#   run lock:   t token, h host, o node, i pid, b process start, a started (µs), l lease (ms),
#               x attempt (tells two deliveries of one token apart)
# Times are the server's TIME as whole microseconds, so no float ever rounds them.
_PRELUDE = """
-- Redis < 5 replicates scripts verbatim and refuses a write after TIME; this opts in.
-- (Redis 7, which names its version here, replicates only effects: no call needed.)
if not redis.REDIS_VERSION_NUM and redis.replicate_commands then pcall(redis.replicate_commands) end
local function clock()
  local t = redis.call('TIME')
  return t[1] .. string.sub('00000', #t[2]) .. t[2]  -- the microseconds zero-padded to 6 digits
end
-- What is in the way, as one JSON string: [now, queue fields, queue pttl, run
-- fields, run pttl], a lock's fields false if it is not there. The client parses
-- one string, not a score of replies (a string, where success is the integer 1).
local function snapshot(now, q)  -- q: the queue lock's fields, if already read
  q = q or redis.call('HMGET', KEYS[1], 't', 's', 'a', 'c', 'n', 'p', 'j')
  local r = redis.call('HMGET', KEYS[2], 't', 'h', 'o', 'i', 'b', 'a', 'l')
  local qttl, rttl = -2, -2
  if q[1] then qttl = redis.call('PTTL', KEYS[1]) else q = false end
  if r[1] then rttl = redis.call('PTTL', KEYS[2]) else r = false end
  return cjson.encode({now, q, qttl, r, rttl})
end
-- ARGV[i..i+5]: host, node, pid, pstart, lease_ms, attempt ('' : keep any the lock has).
-- started: when the token's run began (kept across its renewals and re-takes).
-- One HSET for all fields: on a cold server each call costs more than its
-- own work, so the hot paths make as few as they can.
local function set_run(token, started, i)
  if ARGV[i + 5] ~= '' then
    redis.call('HSET', KEYS[2], 't', token, 'h', ARGV[i], 'o', ARGV[i + 1], 'i', ARGV[i + 2],
               'b', ARGV[i + 3], 'a', started, 'l', ARGV[i + 4], 'x', ARGV[i + 5])
  else
    redis.call('HSET', KEYS[2], 't', token, 'h', ARGV[i], 'o', ARGV[i + 1], 'i', ARGV[i + 2],
               'b', ARGV[i + 3], 'a', started, 'l', ARGV[i + 4])
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[i + 4])
end
-- ARGV[2..6]: ttl_ms (0: none), cls, cls length in the key ('' : none), args, job_id.
-- KEYS[1] does not exist here, so no field of an earlier lock can linger.
local function set_queue(token, state, now)
  local name, value = 'n', ARGV[4]
  if value == '' then name, value = 'c', ARGV[3] end
  if value ~= '' and ARGV[6] == '' then  -- the usual shapes, without building a table
    if ARGV[5] ~= '' then
      redis.call('HSET', KEYS[1], 't', token, 's', state, 'a', now, name, value, 'p', ARGV[5])
    else
      redis.call('HSET', KEYS[1], 't', token, 's', state, 'a', now, name, value)
    end
  else
    local hset = {'HSET', KEYS[1], 't', token, 's', state, 'a', now}
    if value ~= '' then hset[#hset + 1] = name; hset[#hset + 1] = value end
    if ARGV[5] ~= '' then hset[#hset + 1] = 'p'; hset[#hset + 1] = ARGV[5] end
    if ARGV[6] ~= '' then hset[#hset + 1] = 'j'; hset[#hset + 1] = ARGV[6] end
    redis.call(unpack(hset))
  end
  if ARGV[2] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
end
"""

# ARGV: token, ttl_ms, cls, cls_len, args, job_id, mode ('q' or 'r'), host, node, pid, pstart, lease_ms,
#       attempt
# Returns 1 when taken, else a snapshot of what is in the way.
_CLAIM = (
    _PRELUDE
    + """
local now = clock()
local q = redis.call('HMGET', KEYS[1], 't', 's', 'a', 'c', 'n', 'p', 'j')  -- all a conflict reports
if q[2] then
  if q[2] == 'r' and redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[1])  -- orphan: its holder stopped beating
  else
    return snapshot(now, q)
  end
end
if ARGV[7] == 'r' then
  if redis.call('EXISTS', KEYS[2]) == 1 then return snapshot(now) end
  set_queue(ARGV[1], 'r', now)
  set_run(ARGV[1], now, 8)  -- no run lock: it starts now
else
  set_queue(ARGV[1], 'q', now)
end
return 1
"""
)

# ARGV: token, ttl_ms, cls, cls_len, args, job_id, flags, host, node, pid, pstart, lease_ms, attempt
# flags: 'a' (adopt) or '-', then the queue mode: 'r' (run), 'x' (release) or 'k' (keep).
# A run lock of the same token but another attempt is a second delivery: in the way.
# Returns 1 when the run lock is taken, else a snapshot of what is in the way.
_START = (
    _PRELUDE
    + """
local now = clock()
local run = redis.call('HMGET', KEYS[2], 't', 'x', 'a')
if run[1] and (run[1] ~= ARGV[1] or (run[2] and run[2] ~= ARGV[13])) then return snapshot(now) end
set_run(ARGV[1], run[1] and run[3] or now, 8)
local mode = string.sub(ARGV[7], 2, 2)
if mode == 'k' then return 1 end
local qtok = redis.call('HGET', KEYS[1], 't')
local mine = qtok and (qtok == ARGV[1] or string.sub(ARGV[7], 1, 1) == 'a')
if mode == 'x' then
  if mine then redis.call('DEL', KEYS[1]) end
elseif not qtok then
  set_queue(ARGV[1], 'r', now)
elseif mine then
  redis.call('HSET', KEYS[1], 't', ARGV[1], 's', 'r')
end
return 1
"""
)

# KEYS[1]: queue lock. ARGV: token, job_id. Returns 1 if recorded, 0 if the lock is not ours.
_ATTACH = """
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'j', ARGV[2])
return 1
"""

# ARGV: token, ttl_ms (0: none), cls, cls_len, args, job_id.
# Drops the token's run lock and makes its queue lock queued again (created if
# missing); returns 0, changing no queue lock, if the key is another's.
_REQUEUE = (
    _PRELUDE
    + """
local now = clock()
if redis.call('HGET', KEYS[2], 't') == ARGV[1] then redis.call('DEL', KEYS[2]) end
local q = redis.call('HMGET', KEYS[1], 't', 's')
if q[1] and q[1] ~= ARGV[1] then
  if q[2] ~= 'r' or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
  redis.call('DEL', KEYS[1])  -- an orphan: its holder is gone
  q[1] = false
end
if not q[1] then
  set_queue(ARGV[1], 'q', now)
  return 1
end
redis.call('HSET', KEYS[1], 's', 'q')
if ARGV[2] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[2]) else redis.call('PERSIST', KEYS[1]) end
return 1
"""
)

# KEYS[1]: run lock. ARGV: token, lease_ms. Returns 1 if renewed, 0 if not ours.
_RENEW = """
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'l', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# ARGV: token, keep_queue ('1' or '0'). Deletes each lock that is still the token's.
_FINISH = """
local run = redis.call('HGET', KEYS[2], 't') == ARGV[1]
local queue = ARGV[2] == '0' and redis.call('HGET', KEYS[1], 't') == ARGV[1]
if run and queue then
  redis.call('DEL', KEYS[1], KEYS[2])
elseif run then
  redis.call('DEL', KEYS[2])
elseif queue then
  redis.call('DEL', KEYS[1])
end
return 1
"""

# KEYS[1]: queue lock. ARGV: token or '' (any). Returns 1 if a queued lock was dropped.
_DEQUEUE = """
local q = redis.call('HMGET', KEYS[1], 's', 't')
if q[1] ~= 'q' then return 0 end
if ARGV[1] ~= '' and q[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

# ARGV: queue token or '', run token or ''. Returns how many locks went.
_RECLAIM = """
local gone = 0
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 't') == ARGV[1] then
  gone = gone + redis.call('DEL', KEYS[1])
end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[2], 't') == ARGV[2] then
  gone = gone + redis.call('DEL', KEYS[2])
end
return gone
"""

_QUEUE_MODES: dict[QueueMode, str] = {"run": "r", "release": "x", "keep": "k"}

_READ = _PRELUDE + "\nreturn snapshot(clock())\n"

_decode_json = json.JSONDecoder().decode


def _text(value: Any) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def _micros(value: Any) -> float:
    return int(value) / 1_000_000


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
        self.namespace = namespace
        self._prefix = namespace + ":{"
        self._claim = self._script(_CLAIM)
        self._start = self._script(_START)
        self._renew = self._script(_RENEW)
        self._attach = self._script(_ATTACH)
        self._requeue = self._script(_REQUEUE)
        self._finish = self._script(_FINISH)
        self._dequeue = self._script(_DEQUEUE)
        self._reclaim = self._script(_RECLAIM)
        self._read = self._script(_READ)

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

    def _eval(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        try:
            lanes = self._lanes
            if lanes is None:
                return self._eval_pooled(script, keys, args)
            items = keys + args
            try:
                return lanes.call(self._command(lanes, script, len(keys), items))
            except NoScriptError:  # the server lost its script cache (restart, SCRIPT FLUSH)
                script.sha = self.client.script_load(script.script)
                return lanes.call(self._command(lanes, script, len(keys), items))
        except redis.RedisError as exc:
            raise BackendError(f"{exc} ({self!r})", self.name) from exc

    def _command(self, lanes: Lanes, script: Script, numkeys: int, items: list[Any]) -> bytes:
        shape = (script.sha, numkeys, len(items))
        head = self._heads.get(shape)
        if head is None:
            head = self._heads[shape] = evalsha_head(*shape)
        return pack_after(head, items, lanes.encoding, lanes.errors)

    def _eval_pooled(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        # EVALSHA straight through execute_command: Script.__call__ costs as much
        # again in Python (an import, tuple copies, two more layers) on every call.
        try:
            return self._execute("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            script.sha = self.client.script_load(script.script)
            return self._execute("EVALSHA", script.sha, len(keys), *keys, *args)

    def _state(self, key: str, reply: str | bytes) -> LockState:
        # (bytes decoded as json.loads would, minus its sniffing for UTF-16 and -32)
        text = reply.decode("utf-8", "surrogatepass") if isinstance(reply, bytes) else reply
        now, q, qttl, r, rttl = _decode_json(text)  # q, r: the fields named in _PRELUDE
        queue = run = None
        if q:
            # A field that is not set comes as false.
            token, state, since, cls, cls_len, args, job_id = q
            if cls_len:
                cls = key[: int(cls_len)]
            queue = QueueRecord(
                token=token,
                state=RUNNING if state == "r" else QUEUED,
                since=_micros(since),
                meta=QueueMeta(cls or "", args or "", job_id or ""),
                ttl=int(qttl) / 1000 if int(qttl) >= 0 else None,
            )
        if r:
            token, host, node, pid, pstart, started, lease = r
            run = RunRecord(
                token=token,
                holder=Holder(host, node, int(pid), int(pstart)),
                started=_micros(started),
                lease=int(lease) / 1000,
                lease_left=max(int(rttl), 0) / 1000,
            )
        return LockState(key, queue, run, _micros(now))

    @staticmethod
    def _args(
        key: str, token: str, meta: QueueMeta, ttl: float | None, *, flag: str, run: RunClaim | None
    ) -> list[Any]:
        cls, cls_len = meta.cls, ""
        if cls and key.startswith(cls):
            cls, cls_len = "", str(len(cls))  # the key already holds it
        args: list[Any] = [token, _ms(ttl) if ttl else 0, cls, cls_len, meta.args, meta.job_id, flag]
        if run is not None:
            h = run.holder
            args += [h.host, h.node, h.pid, h.pstart, _ms(run.lease), run.attempt]
        return args

    def claim(
        self,
        key: str,
        token: str,
        *,
        meta: QueueMeta,
        ttl: float | None = None,
        run: RunClaim | None = None,
    ) -> LockState | None:
        args = self._args(key, token, meta, ttl, flag="q" if run is None else "r", run=run)
        reply = self._eval(self._claim, self._keys(key), args)
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
        args = self._args(key, token, meta, ttl, flag=flags, run=run)
        reply = self._eval(self._start, self._keys(key), args)
        return None if reply == 1 else self._state(key, reply)

    def attach(self, key: str, token: str, job_id: str) -> bool:
        return bool(self._eval(self._attach, self._keys(key)[:1], [token, job_id]))

    def requeue(self, key: str, token: str, *, meta: QueueMeta, ttl: float | None) -> bool:
        args = self._args(key, token, meta, ttl, flag="", run=None)[:6]
        return bool(self._eval(self._requeue, self._keys(key), args))

    def renew(self, key: str, token: str, lease: float) -> bool:
        return bool(self._eval(self._renew, self._keys(key)[1:], [token, _ms(lease)]))

    def finish(self, key: str, token: str, *, keep_queue: bool = False) -> None:
        self._eval(self._finish, self._keys(key), [token, "1" if keep_queue else "0"])

    def dequeue(self, key: str, token: str | None = None) -> bool:
        return bool(self._eval(self._dequeue, self._keys(key)[:1], [token or ""]))

    def reclaim(self, key: str, queue_token: str | None, run_token: str | None) -> bool:
        return bool(self._eval(self._reclaim, self._keys(key), [queue_token or "", run_token or ""]))

    def read(self, key: str) -> LockState:
        return self._state(key, self._eval(self._read, self._keys(key), []))

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
