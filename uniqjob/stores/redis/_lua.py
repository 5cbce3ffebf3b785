"""The Lua scripts behind RedisBackend: one per primitive, each one atomic step.

Every script reads the server's clock (``TIME``), never the client's, and
touches only the keys of one lock key, which share a hash tag (one cluster
slot): the queue lock, the run lock and the key's last fence.

A script reads everything it needs before it writes anything, so a record of
the wrong shape stops it before any change: it then answers with an error
reply ``UNIQJOB_CORRUPT <i> <reason>`` naming ``KEYS[i]``, which RedisBackend
raises as :class:`~uniqjob.errors.CorruptRecordError`.

``CHECKS`` (the corrupt-record reply, the check of a failed ``redis.pcall``)
and ``CLOCK`` (the server's ``TIME`` in whole microseconds) are the semaphore
scripts' too (``_semaphore_lua``): every script reads the time through ``clock()``.
"""

from __future__ import annotations

__all__ = ["CHECKS", "CLAIM", "CLOCK", "CORRUPT", "START", "corrupt_reply"]

#: The start of the error reply a script gives for a damaged record: then the index of its key
#: (1-based, as in KEYS), a space, and why (a raised one ends its reason with a tab; see ``halt``).
CORRUPT = "UNIQJOB_CORRUPT "

CHECKS = """
-- The reply for a damaged record in KEYS[i]: returned by the lock scripts, raised by halt().
local function corrupt(i, why)
  return redis.error_reply('UNIQJOB_CORRUPT ' .. i .. ' ' .. why)
end
-- Stop the script for a damaged record in KEYS[i]. The tab ends the reason: Redis may add
-- where the error was raised after it.
local function halt(i, why)
  error(corrupt(i, why .. '\\t'))
end
local function failed(v) return type(v) == 'table' and v.err ~= nil end
"""

CLOCK = """
-- Redis < 5 replicates scripts verbatim and refuses a write after TIME; this opts in.
-- (Redis 7, which names its version here, replicates only effects: no call needed.)
if not redis.REDIS_VERSION_NUM and redis.replicate_commands then pcall(redis.replicate_commands) end
-- The server's clock in whole microseconds, as text (the microseconds zero-padded to 6 digits),
-- so no float ever rounds it; tonumber() of it is exact (below 2^53 until 2255).
local function clock()
  local t = redis.call('TIME')
  return t[1] .. string.sub('00000', #t[2]) .. t[2]
end
-- The same instant in whole milliseconds (the unit the semaphore records are stored in).
local function ms(us)
  return math.floor(tonumber(us) / 1000)
end
"""


def corrupt_reply(exc: BaseException, count: int) -> tuple[int, str] | None:
    """Which of a script's ``count`` keys (0-based) a ``UNIQJOB_CORRUPT`` error ``exc`` names, and why.

    None if ``exc`` is no such reply. A reason raised by ``halt`` ends at its tab.
    """
    message = str(exc)
    if not message.startswith(CORRUPT):
        return None
    index, _, reason = message[len(CORRUPT) :].partition(" ")
    if not (index.isdigit() and 0 < int(index) <= count):
        return None  # not ours after all
    return int(index) - 1, reason.rpartition("\t")[0] or reason


# The fields a snapshot reports, by name, each with its letter in the lock's hash; the
# scripts read them in this order (HMGET), and _replies.py unpacks them by these names.
QUEUE_FIELDS = {
    "token": "t", "state": "s", "since": "a", "cls": "c", "cls_len": "n", "args": "p", "job_id": "j",
    "call": "k", "p_token": "P", "p_args": "A", "p_job_id": "J", "p_call": "K", "due": "d",
}  # fmt: skip
RUN_FIELDS = {
    "token": "t", "host": "h", "node": "o", "pid": "i", "pstart": "b", "started": "a", "lease": "l",
    "fence": "f", "stop": "k",
}  # fmt: skip
#: The snapshot's JSON array after its mark (see snapshot()): the locks' fields false if absent.
SNAPSHOT = ("now", "queue", "queue_ttl", "run", "run_ttl")

# The ARGV of the scripts that write a queue lock, by name: what every one of them starts with,
# then CLAIM's and START's run lock (after their mode / flags) or REQUEUE's attempt.
QUEUE_ARGV = ("token", "ttl_ms", "cls", "cls_len", "args", "job_id")
RUN_ARGV = ("host", "node", "pid", "pstart", "lease_ms", "attempt")
CLAIM_ARGV = (*QUEUE_ARGV, "mode", *RUN_ARGV, "call", "coalesce", "wait_ms", "longest_ms")
START_ARGV = (*QUEUE_ARGV, "flags", *RUN_ARGV)
REQUEUE_ARGV = (*QUEUE_ARGV, "attempt")


def _hmget(fields: dict[str, str]) -> str:
    return ", ".join(f"'{letter}'" for letter in fields.values())


# Reads go through redis.pcall, whose error (a table with .err) is checked: a
# WRONGTYPE raised by redis.call would end the script with an error that does
# not say which key, and a key of another type is a damaged record, not an outage.
_CHECKS = (
    CHECKS
    + """
-- A run lock's attempt x (false: none recorded) is another delivery's than the caller's
-- attempt ('' : the caller has none, so the token alone decides).
local function other_attempt(x, attempt)
  return attempt ~= '' and x and x ~= '' and x ~= attempt
end
-- The reply for a read of KEYS[i] that failed (nearly always WRONGTYPE: a key of another type).
local function unreadable(i, v, want)
  local kind = redis.call('TYPE', KEYS[i])
  kind = type(kind) == 'table' and kind.ok or tostring(kind)
  return corrupt(i, 'a Redis ' .. kind .. ' where a ' .. want .. ' belongs (' .. tostring(v.err) .. ')')
end
"""
)

# Shared by the scripts that take locks. KEYS[1] is the queue lock (a hash),
# KEYS[2] the run lock (a hash), KEYS[3] the key's last fence (a string).
# Every held lock is one small hash, so its bytes count: field names are one
# letter, empty fields are left out, and a class name that the key already
# starts with is kept as its length (the queue hash then fits a small listpack).
#   queue lock: t token, s state ('q' queued / 'r' running), a since (µs),
#               c class or n its length in the key, p arguments preview, j job id,
#               k the call's arguments (JSON, policy keep_last); a pending call (keep_last):
#               P its token, A its arguments preview, J its job id, K its arguments;
#               d when its job is due (µs, debounce), b the token whose finish queued it (a pending call);
#               w, z, y the token, arguments preview and job id of the call it replaced, until it starts
#   run lock:   t token, h host, o node, i pid, b process start, a started (µs), l lease (ms),
#               x attempt (tells two deliveries of one token apart), f fence, k who asked it to stop
# Times are the server's TIME as whole microseconds, so no float ever rounds them.
# The last fence outlives the run locks (a day after each grant): fences stay increasing across releases.
_PRELUDE = (
    _CHECKS
    + CLOCK
    + """
local function present(fields)  -- a hash read with HMGET exists if any field we know is set
  for i = 1, #fields do if fields[i] then return true end end
  return false
end
-- What is in the way, as a mark and one JSON string: [now, queue fields, queue
-- pttl, run fields, run pttl], a lock's fields false if it is not there. The client parses
-- one string, not a score of replies (a string, where success is an integer).
local function snapshot(now, q)  -- q: the queue lock's fields, if already read
  if not q then
    q = redis.pcall('HMGET', KEYS[1], """
    + _hmget(QUEUE_FIELDS)
    + """)
    if failed(q) then return unreadable(1, q, 'hash') end
  end
  local r = redis.pcall('HMGET', KEYS[2], """
    + _hmget(RUN_FIELDS)
    + """)
  if failed(r) then return unreadable(2, r, 'hash') end
  local qttl, rttl = -2, -2
  if present(q) then qttl = redis.call('PTTL', KEYS[1]) else q = false end
  if present(r) then rttl = redis.call('PTTL', KEYS[2]) else r = false end
  -- First a mark: 'Q' for the usual duplicate (queued, no job id, no run lock), whose
  -- snapshot the client need not read; for a queued lock with a job id and no run lock,
  -- 'J<µs since it was queued> S', so the client reads it only once its queue may be asked
  -- about the job (suspect_after); 'S' for any other.
  local mark = 'S'
  if q and q[1] and q[2] == 'q' and not r then
    local since = tonumber(q[3])
    if not q[7] then mark = 'Q' elseif since then mark = string.format('J%.0f S', tonumber(now) - since) end
  end
  return mark .. cjson.encode({now, q, qttl, r, rttl})  -- SNAPSHOT
end
-- The floor for the next fence: the last one issued for this key (0: none), or a reply naming KEYS[3].
-- A last fence that cannot be read (another type, not a whole number) is no floor: the new one
-- then comes from the clock alone and is written over it (as the file store does), rather than
-- blocking the key behind a record that no lock listing shows.
local function last_fence()
  local last = redis.pcall('GET', KEYS[3])
  if not last then return 0 end
  local n = not failed(last) and tonumber(last)
  if not n or n < 0 or n ~= math.floor(n) then
    redis.log(redis.LOG_WARNING, 'uniqjob: writing over an unreadable last fence ' .. KEYS[3])
    return 0
  end
  return n
end
-- A new fence: now in µs, or one more than the last, whichever is larger; kept as the key's last.
-- (Whole numbers below 2^53 are exact in Lua's doubles: µs since 1970 stay below until 2255.)
local function new_fence(now, floor)
  local n = tonumber(now)
  if n <= floor then n = floor + 1 end
  local text = string.format('%.0f', n)
  redis.call('SET', KEYS[3], text, 'PX', 86400000)
  return n, text
end
-- ARGV[i..i+5]: host, node, pid, pstart, lease_ms, attempt ('' : keep any the lock has).
-- started: when the token's run began (kept across its renewals and re-takes).
-- One HSET for all fields: on a cold server each call costs more than its own work.
local function set_run(token, started, i, fence)
  local hset = {'HSET', KEYS[2], 't', token, 'h', ARGV[i], 'o', ARGV[i + 1], 'i', ARGV[i + 2],
                'b', ARGV[i + 3], 'a', started, 'l', ARGV[i + 4], 'f', fence}
  if ARGV[i + 5] ~= '' then hset[#hset + 1] = 'x'; hset[#hset + 1] = ARGV[i + 5] end
  redis.call(unpack(hset))
  redis.call('PEXPIRE', KEYS[2], ARGV[i + 4])
end
-- ARGV[2..6]: ttl_ms (0: none), cls, cls length in the key ('' : none), args, job_id.
-- KEYS[1] does not exist here, so no field of an earlier lock can linger.
local function set_queue(token, state, now)
  local hset = {'HSET', KEYS[1], 't', token, 's', state, 'a', now}
  local name, value = 'n', ARGV[4]
  if value == '' then name, value = 'c', ARGV[3] end
  if value ~= '' then hset[#hset + 1] = name; hset[#hset + 1] = value end
  if ARGV[5] ~= '' then hset[#hset + 1] = 'p'; hset[#hset + 1] = ARGV[5] end
  if ARGV[6] ~= '' then hset[#hset + 1] = 'j'; hset[#hset + 1] = ARGV[6] end
  redis.call(unpack(hset))
  if ARGV[2] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
end
-- A run lock of this token whose attempt is this one (or that names none): the caller's own.
local function own_run(run, token, attempt)
  return run[1] == token and (not run[2] or run[2] == attempt)
end
-- KEYS[4]: the key's refused calls (Backend.drops), a hash kept an hour and a minute after its
-- newest minute began: c the class or n its length in the key (as the queue lock keeps them), and
-- per minute of the server clock and kind '<minute><kind>' -> count (kind '' a dropped duplicate,
-- 'c' coalesced, 'r' replaced). drop (from the mode or flags): '+' counts a refusal, '=<minute>'
-- takes back an earlier refusal's count once a retry is granted (the caller reclaimed what was in
-- the way), '' neither. A call without a class is not counted, nor a refusal by a run lock of its
-- own token (rtok: a second delivery of one job). A counter that cannot be written is logged,
-- never in the way of a lock.
local function count_drop(now, drop, rtok, kind)
  if drop ~= '+' or rtok == ARGV[1] then return end
  local name, value = 'n', ARGV[4]
  if value == '' then name, value = 'c', ARGV[3] end
  if value == '' then return end
  local m = string.format('%.0f', math.floor(tonumber(now) / 60000000))
  local n = redis.pcall('HINCRBY', KEYS[4], m .. (kind or ''), 1)
  if failed(n) then
    redis.log(redis.LOG_WARNING, 'uniqjob: cannot count a duplicate in ' .. KEYS[4] .. ': ' .. n.err)
  elseif n == 1 then  -- a new bucket (a few a minute at most): name the class, drop minutes past keeping
    local old = tonumber(m) - 61
    for _, f in ipairs(redis.call('HKEYS', KEYS[4])) do
      local b = tonumber(string.match(f, '^%d+'))
      if b and b < old then redis.call('HDEL', KEYS[4], f) end
    end
    redis.call('HSET', KEYS[4], name, value)
    redis.call('PEXPIRE', KEYS[4], 3660000)
  end
end
-- A refusal's reply (a snapshot, or what names a damaged record), its drop (of kind) counted once it is read.
local function refused(now, drop, rtok, q, kind)
  local reply = snapshot(now, q)
  if type(reply) == 'string' then count_drop(now, drop, rtok, kind) end
  return reply
end
-- Write the queue lock's fields {name, value, ...}: the empty ones are deleted (never kept empty).
local function put(fields)
  local hset, hdel = {'HSET', KEYS[1]}, {'HDEL', KEYS[1]}
  for i = 1, #fields, 2 do
    if fields[i + 1] ~= '' then
      hset[#hset + 1] = fields[i]; hset[#hset + 1] = fields[i + 1]
    else
      hdel[#hdel + 1] = fields[i]
    end
  end
  if #hset > 2 then redis.call(unpack(hset)) end
  if #hdel > 2 then redis.call(unpack(hdel)) end
end
-- A debounced lock's due time (µs text): wait ms from now, at most longest ms ('': none) after since.
local function due(now, since, wait, longest)
  local d = tonumber(now) + tonumber(wait) * 1000
  if since and longest ~= '' then d = math.min(d, tonumber(since) + tonumber(longest) * 1000) end
  return string.format('%.0f', d)
end
-- The queued lock q runs with the latest call's arguments (and a pending call is dropped): its
-- due time ('' : none) pushed back when debounced (wait, longest: see CLAIM). Returns the due time.
local function take_latest(q, now, call, wait, longest)
  local fields, d = {'p', ARGV[5], 'k', call}, ''
  if q[9] then
    for _, f in ipairs({'P', 'A', 'J', 'K'}) do fields[#fields + 1] = f; fields[#fields + 1] = '' end
  end
  if wait ~= '' then d = due(now, q[3], wait, longest) end
  if d ~= '' or q[13] then fields[#fields + 1] = 'd'; fields[#fields + 1] = d end
  put(fields)
  return d
end
-- Take back a count of minute drop ('=<minute>'): a dropped duplicate's, else a coalesced or replaced one's.
local function take_back(drop)
  if string.sub(drop, 1, 1) ~= '=' then return end
  local b = string.sub(drop, 2)
  for _, kind in ipairs({'', 'c', 'r'}) do
    local n = tonumber(redis.pcall('HGET', KEYS[4], b .. kind))
    if n and n > 0 then
      redis.call('HINCRBY', KEYS[4], b .. kind, -1)
      return
    end
  end
end
"""
)

# KEYS: queue lock, run lock, last fence, dropped duplicates.
# ARGV: token, ttl_ms, cls, cls_len, args, job_id, mode ('q' or 'r', then a drop: see count_drop),
#       host, node, pid, pstart, lease_ms, attempt (none with mode 'q'), call (the arguments
#       as JSON), coalesce ('l' keep_last or 'p' replace), wait_ms, longest_ms (debounce: a
#       lock taken or made latest is due in wait_ms, at most longest_ms after it was taken, ''
#       none; these four are optional, and come right after mode with mode 'q')
# Returns 1 when the queue lock is taken (mode 'q'), the fence when both are
# (mode 'r'), else a snapshot of what is in the way, after a letter if a live queue lock
# of another token was coalesced: 'L' latest, 'P' pending, 'R' replaced (the lock is ours);
# or, for the usual 'L' (no run lock), no snapshot but 'l <now> <since> <pttl> <due> <token> <job_id>'.
# Idempotent for its token: a retry (its reply lost) finds its own lock and succeeds again, with the
# fence it was given, as long as no other token took the run lock meanwhile.
CLAIM = (
    _PRELUDE
    + """
local now = clock()
local q = redis.pcall('HMGET', KEYS[1], """
    + _hmget(QUEUE_FIELDS)
    + """)  -- all a conflict reports
if failed(q) then return unreadable(1, q, 'hash') end
local mode, drop = string.sub(ARGV[7], 1, 1), string.sub(ARGV[7], 2)
local call, co, wait, longest = '', '', '', ''  -- the optional last four: after mode 'q', or RUN_ARGV
if #ARGV == 11 or #ARGV == 17 then call, co, wait, longest = unpack(ARGV, #ARGV - 3) end
local run, floor
if mode == 'r' then  -- read all first: a damaged record must stop the script before any write
  run = redis.pcall('HMGET', KEYS[2], 't', 'x', 'f')
  if failed(run) then return unreadable(2, run, 'hash') end
  floor = last_fence()
end
local mine = false
if present(q) then
  if q[2] == 'r' and redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[1])  -- orphan: its holder stopped beating (a retry of ours starts afresh)
    q = false
  elseif q[1] == ARGV[1] then
    mine = true  -- a retry whose first reply was lost
  else
    local how = ''  -- what this conflict coalesces to: 'L' latest, 'R' replaced, 'P' pending
    if co == 'l' then how = q[2] == 'q' and 'L' or 'P' elseif co == 'p' and q[2] == 'q' then how = 'R' end
    if how == 'L' and tonumber(q[3]) and redis.call('EXISTS', KEYS[2]) == 0 then
      -- The usual coalesced call: a queued lock, no run lock. A short reply, no snapshot to
      -- encode or parse: 'l' now since pttl due token job_id, the lock as this call leaves it.
      count_drop(now, drop, false, 'c')
      local d = take_latest(q, now, call, wait, longest)
      return table.concat({'l', now, q[3], redis.call('PTTL', KEYS[1]), d, q[1], q[7] or ''}, ' ')
    end
    local reply = refused(now, drop, run and run[1], q, ({L = 'c', P = 'c', R = 'r'})[how])
    if type(reply) ~= 'string' or how == '' then return reply end
    if how == 'L' then  -- the queued call runs with the latest arguments
      take_latest(q, now, call, wait, longest)
    elseif how == 'R' then  -- replaced: the lock is ours, with our job
      put({'t', ARGV[1], 'a', now, 'p', ARGV[5], 'j', ARGV[6], 'k', '', 'b', '',
           'w', q[1], 'z', q[6] or '', 'y', q[7] or ''})  -- w, z, y: the replaced call, for an undo
    else  -- waits behind the running call
      put({'P', ARGV[1], 'A', ARGV[5], 'J', ARGV[6], 'K', call})
    end
    return how .. reply
  end
else
  q = false
end
if mode ~= 'r' then
  if not mine then
    set_queue(ARGV[1], 'q', now)
    if wait ~= '' then redis.call('HSET', KEYS[1], 'd', due(now, false, wait, '')) end
  end
  take_back(drop)
  return 1
end
local fence
if present(run) then
  if not (mine and own_run(run, ARGV[1], ARGV[13])) then return refused(now, drop, run[1], q) end
  fence = tonumber(run[3])  -- our own run lock: the fence it was granted
  if run[3] and not fence then return corrupt(2, 'field f (fence) is not a number') end
  if fence then redis.call('PEXPIRE', KEYS[2], ARGV[12]) end
end
if not fence then
  local text
  fence, text = new_fence(now, floor)
  set_run(ARGV[1], now, 8, text)  -- no run lock: it starts now
end
if not q then
  set_queue(ARGV[1], 'r', now)
elseif q[2] ~= 'r' then
  redis.call('HSET', KEYS[1], 's', 'r')
end
take_back(drop)
return fence
"""
)

# KEYS: queue lock, run lock, last fence, dropped duplicates.
# ARGV: token, ttl_ms, cls, cls_len, args, job_id, flags, host, node, pid, pstart, lease_ms, attempt
# flags: 'a' (adopt) or '-', then the queue mode: 'r' (run), 'x' (release), 'k' (keep) or 'o'
# (own: as 'r', refused unless the queue lock is the token's and due, or gone with a ttl; then
# persisted), then a drop: see count_drop.
# A run lock of the same token but another attempt is a second delivery: in the way.
# Returns the fence when the run lock is taken (a re-take keeps the one it
# holds), or {fence, call} when the queue lock it holds records a call (k); else a
# snapshot of what is in the way.
START = (
    _PRELUDE
    + """
local now = clock()
local run = redis.pcall('HMGET', KEYS[2], 't', 'x', 'a', 'f')
if failed(run) then return unreadable(2, run, 'hash') end
local mode = string.sub(ARGV[7], 2, 2)
local qtok, call, due, was = false, false, false, false
if mode ~= 'k' then
  local q = redis.pcall('HMGET', KEYS[1], 't', 'k', 'd', 'w')
  if failed(q) then return unreadable(1, q, 'hash') end
  qtok, call, due, was = q[1], q[2], q[3], q[4]
end
local held = present(run)
local drop = string.sub(ARGV[7], 3)
if held and not own_run(run, ARGV[1], ARGV[13]) then return refused(now, drop, run[1]) end
local mine = qtok and (qtok == ARGV[1] or string.sub(ARGV[7], 1, 1) == 'a')
local own = mode == 'o'
if own then  -- replaced, taken over, or not yet due (debounce): refused; autoexpired while it waited: runs
  if not (mine or (not qtok and ARGV[2] ~= '0')) or (due and tonumber(due) > tonumber(now)) then
    return refused(now, drop, run[1])
  end
  mode = 'r'
end
local fence = held and tonumber(run[4])
if held and run[4] and not fence then return corrupt(2, 'field f (fence) is not a number') end
take_back(drop)
if fence then
  set_run(ARGV[1], run[3] or now, 8, run[4])  -- a re-take: the same run, its fence
else
  local floor = last_fence()
  local text
  fence, text = new_fence(now, floor)
  set_run(ARGV[1], held and run[3] or now, 8, text)
end
if mode == 'k' then return fence end
if mode == 'x' then
  if mine then redis.call('DEL', KEYS[1]) end
elseif not qtok then
  set_queue(ARGV[1], 'r', now)
elseif mine then
  redis.call('HSET', KEYS[1], 't', ARGV[1], 's', 'r')
  if was then redis.call('HDEL', KEYS[1], 'w', 'z', 'y') end  -- started: no undo gives it back
end
if own then redis.call('PERSIST', KEYS[1]) end  -- kept as long as its run (a pending call waits in it)
if mine and call then return {fence, call} end
return fence
"""
)
