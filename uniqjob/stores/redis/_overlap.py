"""``uniqjob run --overlap`` on Redis: the pending run's key, the OVERLAP script, and READ, which reports it.

A key's pending run (``Backend.overlap``, ``"buffer"``) is a hash beside its locks,
``<namespace>:{<key>}:o`` (the same hash tag: one cluster slot): ``p`` its token, ``h`` its
``host:pid``, ``w`` the token of the run whose holder watches it run (``"follow"``; once it took
the key, ``p`` and ``h`` go and ``w`` tells that watcher); it expires with the lease the pending
run gave, unless that run calls again. A
stop request (``"terminate"``) is the run lock's field ``k``, which RENEW refuses to extend; a run
coalesced into the pending run marks the run lock's field ``w`` (``"follow"`` reads it).
"""

from __future__ import annotations

from ..base import Overlap
from ._lua import _CHECKS, _PRELUDE

__all__ = ["KEYS", "OVERLAP", "READ", "REPLIES"]

#: A key's Redis names that READ and OVERLAP take: its queue lock, run lock and pending run.
KEYS = ("q", "r", "o")

# KEYS: queue lock, run lock, pending run. ARGV: none. Returns a snapshot of both locks (see _lua's
# snapshot()), then, after a newline (its JSON holds none), the pending run's host:pid if one waits.
READ = (
    _PRELUDE
    + """
local reply = snapshot(clock())
if type(reply) ~= 'string' then return reply end
local o = redis.pcall('HMGET', KEYS[3], 'p', 'h')
if failed(o) then return unreadable(3, o, 'hash') end
if o[1] and o[2] and o[1] ~= redis.call('HGET', KEYS[2], 't') then reply = reply .. '\\n' .. o[2] end
return reply
"""
)

# KEYS: queue lock, run lock, pending run. ARGV: token, mode ('b' buffer, 't' terminate, 'w' withdraw,
# 'f' follow), lease_ms, the caller's host:pid. Returns 0 free, 1 pending, 2 coalesced, 3 stopping,
# 4 busy (see Backend).
OVERLAP = (
    _CHECKS
    + """
local q = redis.pcall('HMGET', KEYS[1], 't', 's')
if failed(q) then return unreadable(1, q, 'hash') end
local r = redis.pcall('HMGET', KEYS[2], 't', 'k', 'w')
if failed(r) then return unreadable(2, r, 'hash') end
local pw = redis.pcall('HMGET', KEYS[3], 'p', 'w')
if failed(pw) then return unreadable(3, pw, 'hash') end
local o, w = pw[1], pw[2]
if ARGV[2] == 'w' then
  if o == ARGV[1] then
    if w and r[1] == ARGV[1] then  -- it took the key: tell who waits for that
      redis.call('HDEL', KEYS[3], 'p', 'h')
      redis.call('PEXPIRE', KEYS[3], ARGV[3])
    else
      redis.call('DEL', KEYS[3])
    end
  end
  return 0
end
if ARGV[2] == 'f' then
  if r[1] == ARGV[1] then  -- still held: a run waits, or runs coalesced behind it?
    if o and o ~= ARGV[1] then
      redis.call('HSET', KEYS[3], 'w', ARGV[1])  -- watch the pending run take the key
      return 2
    end
    if r[3] then return 1 end
    return 0
  end
  if w ~= ARGV[1] then return 1 end  -- the pending run it watched is gone: the run is the caller's
  if o and not r[1] then return 2 end  -- it still waits
  -- a run holds the key (started after ours: the pending run, or another), or the pending run ran
  if o then redis.call('HDEL', KEYS[3], 'w') else redis.call('DEL', KEYS[3]) end
  return 0
end
local orphan = q[2] == 'r' and not r[1]
local busy = (q[1] and not orphan and q[1] ~= ARGV[1]) or (r[1] and r[1] ~= ARGV[1])
if ARGV[2] == 't' then
  if r[1] and r[1] ~= ARGV[1] then
    if not r[2] then redis.call('HSET', KEYS[2], 'k', ARGV[4]) end
    return 3
  end
  if busy then return 4 end
  return 0
end
if o and o ~= ARGV[1] and o ~= r[1] then  -- a pending run that holds the key is no longer
  if r[1] then redis.call('HSET', KEYS[2], 'w', ARGV[4]) end  -- its holder runs once more if need be
  return 2
end
if not busy then return 0 end
redis.call('HSET', KEYS[3], 'p', ARGV[1], 'h', ARGV[4])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1
"""
)

#: What OVERLAP's integer reply decided.
REPLIES: tuple[Overlap, ...] = ("free", "pending", "coalesced", "stopping", "busy")
