"""The Lua scripts behind RedisBackend: one per primitive, each one atomic step.

Every script reads the server's clock (``TIME``), never the client's, and
touches only the two keys of one lock, which share a hash tag (one cluster slot).
"""

from __future__ import annotations

__all__ = ["ATTACH", "CLAIM", "DEQUEUE", "FINISH", "READ", "RECLAIM", "RENEW", "REQUEUE", "START"]

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
-- What is in the way, as a mark and one JSON string: [now, queue fields, queue
-- pttl, run fields, run pttl], a lock's fields false if it is not there. The client parses
-- one string, not a score of replies (a string, where success is the integer 1).
local function snapshot(now, q)  -- q: the queue lock's fields, if already read
  q = q or redis.call('HMGET', KEYS[1], 't', 's', 'a', 'c', 'n', 'p', 'j')
  local r = redis.call('HMGET', KEYS[2], 't', 'h', 'o', 'i', 'b', 'a', 'l')
  local qttl, rttl = -2, -2
  if q[1] then qttl = redis.call('PTTL', KEYS[1]) else q = false end
  if r[1] then rttl = redis.call('PTTL', KEYS[2]) else r = false end
  -- First a mark: 'Q' for the usual duplicate (queued, no job id, no run lock),
  -- whose snapshot the client need not read; 'S' for any other.
  local mark = 'S'
  if q and q[2] == 'q' and not q[7] and not r then mark = 'Q' end
  return mark .. cjson.encode({now, q, qttl, r, rttl})
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
CLAIM = (
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
START = (
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
ATTACH = """
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'j', ARGV[2])
return 1
"""

# ARGV: token, ttl_ms (0: none), cls, cls_len, args, job_id.
# Drops the token's run lock and makes its queue lock queued again (created if
# missing); returns 0, changing no queue lock, if the key is another's.
REQUEUE = (
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
RENEW = """
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'l', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# ARGV: token, keep_queue ('1' or '0'). Deletes each lock that is still the token's.
FINISH = """
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
DEQUEUE = """
local q = redis.call('HMGET', KEYS[1], 's', 't')
if q[1] ~= 'q' then return 0 end
if ARGV[1] ~= '' and q[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

# ARGV: queue token or '', run token or ''. Returns how many locks went.
RECLAIM = """
local gone = 0
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 't') == ARGV[1] then
  gone = gone + redis.call('DEL', KEYS[1])
end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[2], 't') == ARGV[2] then
  gone = gone + redis.call('DEL', KEYS[2])
end
return gone
"""


READ = _PRELUDE + "\nreturn snapshot(clock())\n"
