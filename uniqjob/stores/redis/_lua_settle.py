"""The Lua scripts behind RedisBackend that settle a lock: record a job id, renew, requeue, finish, drop.

The same rules as :mod:`._lua`'s (one key's locks, one hash tag, the server's clock, every
read checked before any write); the scripts that take locks are there.
"""

from __future__ import annotations

from ._lua import _CHECKS, _PRELUDE, CLOCK

__all__ = ["ATTACH", "DEQUEUE", "FINISH", "PURGE", "RECLAIM", "RENEW", "REQUEUE"]

# KEYS[1]: queue lock. ARGV: token, job_id. Returns 1 if recorded, 0 if the lock is not ours.
ATTACH = (
    _CHECKS
    + """
local t = redis.pcall('HGET', KEYS[1], 't')
if failed(t) then return unreadable(1, t, 'hash') end
if t ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'j', ARGV[2])
return 1
"""
)

# KEYS: queue lock, run lock. ARGV: token, ttl_ms (0: none), cls, cls_len, args, job_id, attempt ('': any).
# Drops the token's run lock and makes its queue lock queued again (created if missing).
# Returns 1; or 0, changing no queue lock, if the key is another's, and changing
# nothing if the run lock is the token's but another attempt's (a live delivery).
REQUEUE = (
    _PRELUDE
    + """
local now = clock()
local run = redis.pcall('HMGET', KEYS[2], 't', 'x')
if failed(run) then return unreadable(2, run, 'hash') end
local q = redis.pcall('HMGET', KEYS[1], 't', 's')
if failed(q) then return unreadable(1, q, 'hash') end
if run[1] == ARGV[1] then
  if other_attempt(run[2], ARGV[7]) then return 0 end
  redis.call('DEL', KEYS[2])
end
if q[1] and q[1] ~= ARGV[1] then
  if q[2] ~= 'r' or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
  redis.call('DEL', KEYS[1])  -- an orphan: its holder is gone
  q[1] = false
end
if not q[1] then
  if q[2] then redis.call('DEL', KEYS[1]) end  -- no token: nothing of it may linger in ours
  set_queue(ARGV[1], 'q', now)
  return 1
end
redis.call('HSET', KEYS[1], 's', 'q')
redis.call('HDEL', KEYS[1], 'b')
if ARGV[2] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[2]) else redis.call('PERSIST', KEYS[1]) end
return 1
"""
)

# KEYS[1]: run lock. ARGV: token, lease_ms, attempt ('': any). Returns 1 if renewed, 0 if not ours
# or if its holder was asked to stop (_overlap: the lease is left to lapse where it is).
RENEW = (
    _CHECKS
    + """
local run = redis.pcall('HMGET', KEYS[1], 't', 'x', 'k')
if failed(run) then return unreadable(1, run, 'hash') end
if run[1] ~= ARGV[1] or other_attempt(run[2], ARGV[3]) or run[3] then return 0 end
redis.call('HSET', KEYS[1], 'l', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
)

# KEYS: queue lock, run lock. ARGV: token, keep_queue ('1' or '0'), attempt ('': any).
# Deletes each lock that is still the token's (the key's last fence stays); a queue lock
# holding a pending call (P) becomes that call's, queued, instead.
# Returns 1, or the pending call {token, args, job id, call} that is now queued (b: the token
# and attempt that queued it, so that a retry after a lost reply, and no other release of the
# token, gets it again while it waits); or 0,
# deleting neither, if the run lock is the token's but another attempt's: a live
# delivery, which holds the queue lock too.
FINISH = (
    _CHECKS
    + CLOCK
    + """
local run = redis.pcall('HMGET', KEYS[2], 't', 'x')
if failed(run) then return unreadable(2, run, 'hash') end
local mine = run[1] == ARGV[1]
if mine and other_attempt(run[2], ARGV[3]) then return 0 end
local queue = false
if ARGV[2] == '0' then
  local q = redis.pcall('HMGET', KEYS[1], 't', 'P', 'A', 'J', 'K', 'b', 's', 'p', 'j', 'k')
  if failed(q) then return unreadable(1, q, 'hash') end
  queue = q[1] == ARGV[1]
  if queue and q[2] then  -- the pending call becomes the queued lock
    if mine then redis.call('DEL', KEYS[2]) end
    local p = {q[2] .. '+', q[3] or '', q[4] or '', q[5] or ''}  -- a token of its own: see FOLLOWS
    redis.call('HDEL', KEYS[1], 'P', 'A', 'J', 'K', 'p', 'j', 'k', 'd')
    redis.call('HSET', KEYS[1], 't', p[1], 's', 'q', 'a', clock(), 'b', ARGV[1] .. ' ' .. ARGV[3])
    if p[2] ~= '' then redis.call('HSET', KEYS[1], 'p', p[2]) end
    if p[3] ~= '' then redis.call('HSET', KEYS[1], 'j', p[3]) end
    if p[4] ~= '' then redis.call('HSET', KEYS[1], 'k', p[4]) end
    redis.call('PERSIST', KEYS[1])
    return p
  elseif q[1] and q[6] == ARGV[1] .. ' ' .. ARGV[3] and q[7] == 'q' then  -- a retry of a lost reply
    if mine then redis.call('DEL', KEYS[2]) end
    return {q[1], q[8] or '', q[9] or '', q[10] or ''}
  end
end
if mine and queue then
  redis.call('DEL', KEYS[1], KEYS[2])
elseif mine then
  redis.call('DEL', KEYS[2])
elseif queue then
  redis.call('DEL', KEYS[1])
end
return 1
"""
)

# Drops the queue lock KEYS[1] whose fields w, z, y are ``was``; one that replaced a call not yet
# started (the undo of that replace) gives the key back to that call instead.
_DROP_QUEUE = """
local function drop_queue(was)
  if not was[1] then return redis.call('DEL', KEYS[1]) end
  redis.call('HSET', KEYS[1], 't', was[1])
  if was[2] then redis.call('HSET', KEYS[1], 'p', was[2]) else redis.call('HDEL', KEYS[1], 'p') end
  if was[3] then redis.call('HSET', KEYS[1], 'j', was[3]) else redis.call('HDEL', KEYS[1], 'j') end
  redis.call('HDEL', KEYS[1], 'w', 'z', 'y')
  return 1
end
"""

# KEYS[1]: queue lock. ARGV: token or '' (any). Returns 1 if a queued lock was dropped.
DEQUEUE = (
    _CHECKS
    + _DROP_QUEUE
    + """
local q = redis.pcall('HMGET', KEYS[1], 's', 't', 'w', 'z', 'y')
if failed(q) then return unreadable(1, q, 'hash') end
if q[1] ~= 'q' then return 0 end
if ARGV[1] ~= '' and q[2] ~= ARGV[1] then return 0 end
return drop_queue({q[3], q[4], q[5]})
"""
)

# KEYS: queue lock, run lock. ARGV: queue token or '', run token or ''. Returns how many locks went.
RECLAIM = (
    _CHECKS
    + _DROP_QUEUE
    + """
local qtok, rtok, was = false, false, {}
if ARGV[1] ~= '' then
  local q = redis.pcall('HMGET', KEYS[1], 't', 'w', 'z', 'y')
  if failed(q) then return unreadable(1, q, 'hash') end
  qtok, was = q[1], {q[2], q[3], q[4]}
end
if ARGV[2] ~= '' then
  rtok = redis.pcall('HGET', KEYS[2], 't')
  if failed(rtok) then return unreadable(2, rtok, 'hash') end
end
local gone = 0
if ARGV[1] ~= '' and qtok == ARGV[1] then gone = gone + drop_queue(was) end
if ARGV[2] ~= '' and rtok == ARGV[2] then gone = gone + redis.call('DEL', KEYS[2]) end
return gone
"""
)

# KEYS: queue lock, run lock. ARGV: none. Deletes whatever they hold, of any type; the last fence
# is kept, so fences stay increasing. Returns 1 (queue lock gone) + 2 (run lock gone).
PURGE = """
return redis.call('DEL', KEYS[1]) + 2 * redis.call('DEL', KEYS[2])
"""
