"""The Lua both script families share (locks: ``_lua.py``, semaphores: ``_semaphore_lua.py``), defined once.

``CHECKS`` holds the corrupt-record reply and the check for a failed
``redis.pcall``; ``CLOCK`` the one clock, the server's ``TIME`` in whole
microseconds. Every script that reads the time reads it through ``clock()``.

The semaphore store keeps its stored times (record fields ``dl``, ``ls``,
``since`` and the scores of its ``waiters`` and ``done`` sets) in
milliseconds, as 0.3.0 wrote them, so records written by an earlier version
are read as they were meant: its scripts take ``ms(clock())``, the one place
the unit changes.
"""

from __future__ import annotations

__all__ = ["CHECKS", "CLOCK", "CORRUPT"]

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
