"""The Lua scripts of the Redis semaphore store, one per primitive (see ``stores.semaphores.SemaphoreStore``).

Every script gets the key's six structures as KEYS (slots, parked, entries,
waiters, meta, done; see ``_semaphores.py``), reads the server's ``TIME``
through the shared ``clock()`` (``_lua.py``; the records keep their times in
milliseconds, ``ms(clock())``, as 0.3.0 stored them), and settles the key
before acting, exactly as ``stores/_machine.py`` does for the file and memory stores.

Each script's head states its KEYS, ARGV and reply; an array reply is named
field by field (``Returns {status, promotions, ...}``), and ``_replies.py``
reads it by those names (its ``REPLIES``; a test holds the two in step).
"""

from __future__ import annotations

from ._lua import CHECKS, CLOCK

__all__ = [
    "ACQUIRE",
    "DISCARD",
    "DROP",
    "HANDED",
    "PRELUDE",
    "READ",
    "REAP",
    "RELEASE",
    "RENEW",
    "REQUEUE",
    "START",
    "WITHDRAW",
]

# Shared by every script: the keys, the clock, and settling (lapsed slots, lost handoffs, promotion).
PRELUDE = (
    CHECKS
    + CLOCK
    + """
local SLOTS, PARKED, ENTRIES, WAITERS, META, DONE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
-- A record of the wrong shape stops the script (halt, in _lua.CHECKS): the caller gets it as a
-- CorruptRecordError naming the structure (1-6, as in KEYS), never a Lua error halfway through a step.
local STATES = {reserved = true, promoted = true, running = true}
local VIAS = {queue = true, inline = true}
local function decoded(part, what, raw)
  local ok, v = pcall(cjson.decode, raw)
  if not ok or type(v) ~= 'table' then halt(part, what .. ' is not a JSON object') end
  return v
end
local function texts(v, names)
  for _, n in ipairs(names) do if type(v[n]) ~= 'string' then return n end end
end
local function numbers(v, names)
  for _, n in ipairs(names) do if type(v[n]) ~= 'number' then return n end end
end
local function slot_of(token, raw)
  local s = decoded(1, 'slot ' .. token, raw)
  local bad = texts(s, {'st', 'via', 'h', 'args', 'p'}) or numbers(s, {'dl', 'ls', 'since', 'redo'})
  if bad then halt(1, 'slot ' .. token .. ': field ' .. bad .. ' is missing or mistyped') end
  if not STATES[s.st] then halt(1, 'slot ' .. token .. ': unknown status ' .. s.st) end
  if not VIAS[s.via] then halt(1, 'slot ' .. token .. ': unknown via ' .. s.via) end
  if s.redo ~= math.floor(s.redo) then halt(1, 'slot ' .. token .. ': field redo is not whole') end
  return s
end
local function entry_of(token, raw)
  local e = decoded(3, 'parked call ' .. token, raw)
  local bad = texts(e, {'via', 'h', 'args', 'p'}) or numbers(e, {'ls', 'since'})
  if bad then halt(3, 'parked call ' .. token .. ': field ' .. bad .. ' is missing or mistyped') end
  if not VIAS[e.via] then halt(3, 'parked call ' .. token .. ': unknown via ' .. e.via) end
  return e
end
local function place_of(token)
  local at = redis.call('LPOS', PARKED, token)
  if not at then halt(2, 'parked call ' .. token .. ' is missing from the line') end
  return at + 1
end
local function new_slot(st, via, h, dl, ls, since, args)
  return {st = st, via = via, h = h, dl = dl, ls = ls, since = since, redo = 0, args = args, p = ''}
end
-- a queue promotion whose promoter failed: the caller now owns pushing it again
local function claim_again(token, s, now, caller, handoff, promos)
  s.h = caller; s.dl = now + handoff; s.redo = s.redo + 1
  redis.call('HSET', SLOTS, token, cjson.encode(s))
  promos[#promos + 1] = {token, 'queue', s.p, s.redo}
end
-- a lapsed or dead holder's slot; one that ran a call pushed twice waits (one lease) for its other
-- copy, whose release then remembers the token as done (see _machine.Machine._vacate)
local function free(token, s, now)
  if s.st == 'running' and s.redo > 0 then
    s.st = 'reserved'; s.via = 'queue'; s.h = ''; s.dl = now + s.ls; s.p = ''
    redis.call('HSET', SLOTS, token, cjson.encode(s))
  else
    redis.call('HDEL', SLOTS, token)
  end
end
local function unpark(token)
  redis.call('LREM', PARKED, 1, token)
  redis.call('HDEL', ENTRIES, token)
  redis.call('ZREM', WAITERS, token)
end
local function promote(now, caller, handoff, promos)
  local limit = tonumber(redis.call('HGET', META, 'limit') or '1')
  if not limit then halt(5, 'field limit is not a number') end
  local held = redis.call('HLEN', SLOTS)
  while held < limit do
    local token = redis.call('LPOP', PARKED)
    if not token then break end
    local raw = redis.call('HGET', ENTRIES, token)
    if raw then
      local e = entry_of(token, raw)
      local s
      if e.via == 'inline' then
        local dl = tonumber(redis.call('ZSCORE', WAITERS, token) or now)
        s = new_slot('promoted', 'inline', e.h, dl, e.ls, now, e.args)
      else
        s = new_slot('promoted', 'queue', caller, now + handoff, e.ls, now, e.args)
        s.p = e.p
      end
      redis.call('HDEL', ENTRIES, token)
      redis.call('ZREM', WAITERS, token)
      redis.call('HSET', SLOTS, token, cjson.encode(s))
      held = held + 1
      promos[#promos + 1] = {token, s.via, s.p, 0}
    end
  end
end
local function settle(now, caller, handoff)
  local promos = {}
  redis.call('ZREMRANGEBYSCORE', DONE, '-inf', now)
  local all = redis.call('HGETALL', SLOTS)
  for i = 1, #all, 2 do
    local s = slot_of(all[i], all[i + 1])
    if s.dl <= now then
      if s.st == 'promoted' and s.via == 'queue' then
        claim_again(all[i], s, now, caller, handoff, promos)
      else
        free(all[i], s, now)
      end
    end
  end
  for _, token in ipairs(redis.call('ZRANGEBYSCORE', WAITERS, '-inf', now)) do unpark(token) end
  promote(now, caller, handoff, promos)
  return promos
end
local function tidy()
  if redis.call('HLEN', SLOTS) == 0 and redis.call('LLEN', PARKED) == 0 then
    redis.call('DEL', ENTRIES, WAITERS, META)
  end
end
"""
)

# KEYS: slots, parked, entries, waiters, meta, done (the key's six structures).
# ARGV: token, limit, lease_ms, running ('1'/'0'), holder, park via ('', 'queue', 'inline'),
#       payload, park holder, park lease_ms, cls, args, caller, handoff_ms
# Returns {status, promotions, position, slots (flat hash), now_ms};
# a promotion is {token, via, payload, redo}.
ACQUIRE = (
    PRELUDE
    + """
local now = ms(clock())
local token, limit, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('HSET', META, 'limit', limit, 'cls', ARGV[10])
local promos = settle(now, ARGV[12], tonumber(ARGV[13]))
if redis.call('HEXISTS', SLOTS, token) == 1 then return {'taken', promos, 0, {}, now} end
if redis.call('HEXISTS', ENTRIES, token) == 1 then
  return {'parked', promos, place_of(token), redis.call('HGETALL', SLOTS), now}
end
if redis.call('HLEN', SLOTS) < limit then  -- then nothing is parked: settling promoted it
  local st, via = 'reserved', 'queue'
  if ARGV[4] == '1' then st = 'running' end
  if ARGV[4] == '1' or ARGV[5] ~= '' then via = 'inline' end
  local s = new_slot(st, via, ARGV[5], now + lease, lease, now, ARGV[11])
  redis.call('HSET', SLOTS, token, cjson.encode(s))
  return {'taken', promos, 0, {}, now}
end
if ARGV[6] ~= '' then
  redis.call('RPUSH', PARKED, token)
  local e = {via = ARGV[6], h = ARGV[8], ls = lease, since = now, args = ARGV[11], p = ARGV[7]}
  redis.call('HSET', ENTRIES, token, cjson.encode(e))
  if ARGV[6] == 'inline' then redis.call('ZADD', WAITERS, now + tonumber(ARGV[9]), token) end
  return {'parked', promos, redis.call('LLEN', PARKED), redis.call('HGETALL', SLOTS), now}
end
return {'full', promos, 0, redis.call('HGETALL', SLOTS), now}
"""
)

# KEYS: slots, parked, entries, waiters, meta, done (the key's six structures).
# ARGV: token, holder, lease_ms, takeover holder or '', caller, handoff_ms
# Returns {status, promotions, position, busy (the running holder in the way, or '')}.
START = (
    PRELUDE
    + """
local now = ms(clock())
local token, lease = ARGV[1], tonumber(ARGV[3])
local promos = settle(now, ARGV[5], tonumber(ARGV[6]))
local raw = redis.call('HGET', SLOTS, token)
if raw then
  local s = slot_of(token, raw)
  if s.st == 'running' and s.h ~= ARGV[4] then return {'busy', promos, 0, s.h} end
  s.st = 'running'; s.h = ARGV[2]; s.dl = now + lease; s.ls = lease; s.p = ''
  redis.call('HSET', SLOTS, token, cjson.encode(s))
  return {'run', promos, 0, ''}
end
raw = redis.call('HGET', ENTRIES, token)
if raw then
  local e = entry_of(token, raw)
  if e.via == 'inline' and e.h == ARGV[2] then redis.call('ZADD', WAITERS, now + lease, token) end
  return {'parked', promos, place_of(token), ''}
end
tidy()
if redis.call('ZSCORE', DONE, token) then return {'done', promos, 0, ''} end
return {'missing', promos, 0, ''}
"""
)

# KEYS: slots, parked, entries, waiters, meta, done (the key's six structures).
# ARGV: token, lease_ms, caller, handoff_ms. Returns {status, promotions}.
RENEW = (
    PRELUDE
    + """
local now = ms(clock())
local token, lease = ARGV[1], tonumber(ARGV[2])
local promos = settle(now, ARGV[3], tonumber(ARGV[4]))
local raw = redis.call('HGET', SLOTS, token)
if raw then
  local s = slot_of(token, raw)
  s.dl = now + lease; s.ls = lease
  redis.call('HSET', SLOTS, token, cjson.encode(s))
  return {'ok', promos}
end
raw = redis.call('HGET', ENTRIES, token)
if not raw then tidy(); return {'gone', promos} end
if entry_of(token, raw).via == 'inline' then redis.call('ZADD', WAITERS, now + lease, token) end
return {'ok', promos}
"""
)

# KEYS: slots, parked, entries, waiters, meta, done (the key's six structures).
# ARGV: token, caller, handoff_ms, tombstone_ms. Returns {status, promotions}.
RELEASE = (
    PRELUDE
    + """
local now = ms(clock())
local token = ARGV[1]
local raw = redis.call('HGET', SLOTS, token)
local status = 'gone'
if raw then
  redis.call('HDEL', SLOTS, token)
  status = 'released'
  if slot_of(token, raw).redo > 0 then  -- pushed twice: remember it, so the other copy never runs
    redis.call('ZADD', DONE, now + tonumber(ARGV[4]), token)
    redis.call('PEXPIRE', DONE, ARGV[4])
  end
end
local promos = settle(now, ARGV[2], tonumber(ARGV[3]))
tidy()
return {status, promos}
"""
)

# KEYS: slots, parked, entries, waiters, meta, done (the key's six structures).
# ARGV: token, lease_ms, holder, caller, handoff_ms. Returns {status, promotions}.
REQUEUE = (
    PRELUDE
    + """
local now = ms(clock())
local token, lease = ARGV[1], tonumber(ARGV[2])
local promos = settle(now, ARGV[4], tonumber(ARGV[5]))
local raw = redis.call('HGET', SLOTS, token)
if not raw then tidy(); return {'gone', promos} end
local s = slot_of(token, raw)
if s.st ~= 'running' or s.h ~= ARGV[3] then return {'gone', promos} end
s.st = 'reserved'; s.via = 'queue'; s.h = ''; s.dl = now + lease; s.ls = lease; s.p = ''
redis.call('HSET', SLOTS, token, cjson.encode(s))
return {'ok', promos}
"""
)

# KEYS: slots, parked, entries, waiters, meta, done (the key's six structures).
# ARGV: token, promoter. Returns 1 if marked handed, else 0.
HANDED = (
    PRELUDE
    + """
local now = ms(clock())
local raw = redis.call('HGET', SLOTS, ARGV[1])
if not raw then return 0 end
local s = slot_of(ARGV[1], raw)
if s.st ~= 'promoted' or s.h ~= ARGV[2] then return 0 end
s.st = 'reserved'; s.h = ''; s.dl = now + s.ls; s.p = ''
redis.call('HSET', SLOTS, ARGV[1], cjson.encode(s))
return 1
"""
)

# KEYS: slots, parked, entries, waiters, meta, done (the key's six structures).
# ARGV: token. Returns 'withdrawn', 'slot' or 'gone'.
WITHDRAW = (
    PRELUDE
    + """
if redis.call('HEXISTS', ENTRIES, ARGV[1]) == 1 then
  unpark(ARGV[1])
  tidy()
  return 'withdrawn'
end
if redis.call('HEXISTS', SLOTS, ARGV[1]) == 1 then return 'slot' end
return 'gone'
"""
)

# KEYS: slots, parked, entries, waiters, meta, done (the key's six structures).
# ARGV: caller, handoff_ms, then token, holder pairs. Returns {count, promotions}.
REAP = (
    PRELUDE
    + """
local now = ms(clock())
local caller, handoff = ARGV[1], tonumber(ARGV[2])
local count, promos = 0, {}
for i = 3, #ARGV, 2 do
  local token, h = ARGV[i], ARGV[i + 1]
  local raw = redis.call('HGET', SLOTS, token)
  if raw then
    local s = slot_of(token, raw)
    if s.h == h then
      if s.st == 'promoted' and s.via == 'queue' then
        claim_again(token, s, now, caller, handoff, promos)
      else
        free(token, s, now)
        count = count + 1
      end
    end
  else
    raw = redis.call('HGET', ENTRIES, token)
    if raw then
      local e = entry_of(token, raw)
      if e.via == 'inline' and e.h == h then unpark(token); count = count + 1 end
    end
  end
end
for _, p in ipairs(settle(now, caller, handoff)) do promos[#promos + 1] = p end
tidy()
return {count, promos}
"""
)

# KEYS: slots, parked, entries, waiters, meta, done (the key's six structures).
# ARGV: none. Returns the dropped calls: token, payload, token, payload...
DISCARD = (
    PRELUDE
    + """
local dropped = {}
for _, token in ipairs(redis.call('LRANGE', PARKED, 0, -1)) do
  local raw = redis.call('HGET', ENTRIES, token)
  dropped[#dropped + 1] = token
  local ok, e = pcall(cjson.decode, raw or '')
  dropped[#dropped + 1] = (ok and type(e) == 'table' and type(e.p) == 'string') and e.p or ''
end
redis.call('DEL', PARKED, ENTRIES, WAITERS)
tidy()
return dropped
"""
)

# KEYS: slots, parked, entries, waiters, meta, done (the key's six structures).
# ARGV: caller, handoff_ms, tokens... Returns {count, promotions}.
DROP = (
    PRELUDE
    + """
local now = ms(clock())
local count = 0
for i = 3, #ARGV do count = count + redis.call('HDEL', SLOTS, ARGV[i]) end
local promos = settle(now, ARGV[1], tonumber(ARGV[2]))
tidy()
return {count, promos}
"""
)

# KEYS: slots, parked, entries, waiters, meta, done (the key's six structures).
# ARGV: how many parked calls to show.
# Returns {now_ms, meta (flat hash), slots (flat hash), parked (how many), head (the first tokens),
#          entries (their parked calls, '' if gone)}.
READ = (
    PRELUDE
    + """
-- a read shows what every other step would meet: a structure of the wrong kind is named here too
local KINDS = {'hash', 'list', 'hash', 'zset', 'hash', 'zset'}
for i, k in ipairs(KEYS) do
  local t = redis.call('TYPE', k).ok
  if t ~= 'none' and t ~= KINDS[i] then halt(i, 'holds a ' .. t .. ', not a ' .. KINDS[i]) end
end
local n = tonumber(ARGV[1])
local head = {}
if n > 0 then head = redis.call('LRANGE', PARKED, 0, n - 1) end
local entries = {}
for i, token in ipairs(head) do entries[i] = redis.call('HGET', ENTRIES, token) or '' end
return {ms(clock()), redis.call('HGETALL', META), redis.call('HGETALL', SLOTS), redis.call('LLEN', PARKED),
        head, entries}
"""
)
