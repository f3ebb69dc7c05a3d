"""Lua scripts for the writes that must happen together (Redis runs each one atomically).

Each script checks its preconditions before its first write, so a refused call changes nothing.
Errors are replied as "<CODE> message" (codes in buffer/errors.py). All keys come from KEYS,
built by buffer/keys.py. A session's `status` is a `Sample.Status` value ('pending' while it is
open); a group's `state` is the group's own ('open', 'ready', 'trained', ...).

Each script is a `LuaScript` paired with a NamedTuple of its keys: the Lua reads KEYS by
position, so the tuple's field order is that position, and a caller names every key it passes
(`ScriptBatcher.run` takes only the script's own keys type).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

K = TypeVar("K", bound=tuple[Any, ...])


@dataclass(frozen=True, slots=True)
class LuaScript(Generic[K]):
    keys: type[K]  # KEYS[1] is its first field; a last field that is a tuple is spread (one key per item)
    source: str

    def key_list(self, keys: K) -> list[str]:
        *fixed, last = keys
        return [*fixed, *last] if isinstance(last, tuple) else [*fixed, last]


class SessionKeys(NamedTuple):
    session: str
    group: str
    members: str
    stats: str


class TurnKeys(NamedTuple):
    session: str
    turns: str
    stats: str


class FinishKeys(NamedTuple):
    """`_MEMBER_DONE` reads group, stats and ready at 3, 4 and 5."""

    session: str
    samples: str  # SET_REWARD writes none, but keeps the positions `_MEMBER_DONE` reads
    group: str
    stats: str
    ready: str


class TakenKeys(NamedTuple):
    ready: str
    stats: str
    groups: tuple[str, ...]  # one per group id in ARGV


class DropKeys(NamedTuple):
    group: str
    ready: str
    stats: str


class ReopenKeys(NamedTuple):
    group: str
    members: str
    ready: str
    stats: str
    regenerate: str
    sessions: tuple[str, ...]  # one per stale index in ARGV


class RecoverKeys(NamedTuple):
    group: str
    members: str
    stats: str
    sessions: tuple[str, ...]  # one per index/session pair in ARGV


class AbortKeys(NamedTuple):
    session: str
    members: str
    stats: str


# A group member is done once it failed or has a reward; the last one makes the group trainable,
# or, for an evaluation group (trainable = 0), stored and never queued for a trainer.
# Expects KEYS group/stats/ready at 3/4/5 (as `FinishKeys` names them) and locals gid, failed, now.
_MEMBER_DONE = """
local function member_done(gid, failed, now)
  local done = redis.call('HINCRBY', KEYS[3], 'done', 1)
  if failed then redis.call('HINCRBY', KEYS[3], 'failed', 1) end
  if done ~= tonumber(redis.call('HGET', KEYS[3], 'size')) then return end
  redis.call('HINCRBY', KEYS[4], 'groups_open', -1)
  if redis.call('HGET', KEYS[3], 'trainable') == '0' then
    redis.call('HSET', KEYS[3], 'state', 'evaluated', 'completed_at', now)
    redis.call('HINCRBY', KEYS[4], 'groups_evaluated', 1)
    return
  end
  local entry = redis.call('XADD', KEYS[5], '*', 'group', gid)
  redis.call('HSET', KEYS[3], 'state', 'ready', 'entry', entry, 'completed_at', now)
  redis.call('HINCRBY', KEYS[4], 'groups_completed', 1)
end
"""

# An open session gives its place back: it leaves the members hash (the place is free for a new
# session), and is closed as aborted and retired (stored, never trained on). The caller checks
# that the session is still pending and still holds the place.
_ABORT_MEMBER = """
local function abort_member(members, index, session, stats, now)
  redis.call('HDEL', members, index)
  redis.call('HSET', session, 'status', 'aborted', 'finished_at', now, 'retired_at', now)
  redis.call('HINCRBY', stats, 'sessions_open', -1)
  redis.call('HINCRBY', stats, 'sessions_finished', 1)
end
"""

# ARGV: session_id, group_id, index, group_size, metadata_json, now, trainable ('1' or '0'), owner
OPEN_SESSION = LuaScript(
    SessionKeys,
    """
local old_group = redis.call('HGET', KEYS[1], 'group_id')
if old_group then
  if old_group == ARGV[2] and redis.call('HGET', KEYS[1], 'index') == ARGV[3] then return 0 end
  return redis.error_reply('CONFLICT session ' .. ARGV[1] .. ' already exists in group ' .. old_group ..
    ' at index ' .. redis.call('HGET', KEYS[1], 'index'))
end
local size = redis.call('HGET', KEYS[2], 'size')
if size and size ~= ARGV[4] then
  return redis.error_reply('CONFLICT group ' .. ARGV[2] .. ' has size ' .. size .. ', not ' .. ARGV[4])
end
local trainable = redis.call('HGET', KEYS[2], 'trainable')
if trainable and trainable ~= ARGV[7] then
  return redis.error_reply('CONFLICT group ' .. ARGV[2] .. ' has trainable=' .. trainable .. ', not ' .. ARGV[7])
end
local holder = redis.call('HGET', KEYS[3], ARGV[3])
if holder then
  return redis.error_reply('CONFLICT index ' .. ARGV[3] .. ' of group ' .. ARGV[2] .. ' is taken by session ' ..
    holder .. ' (a group id names one generation of a prompt: generate it again under a new group id)')
end
local seq
if size then
  seq = redis.call('HGET', KEYS[2], 'seq')
else
  seq = redis.call('HINCRBY', KEYS[4], 'group_seq', 1) - 1
  redis.call('HSET', KEYS[2], 'size', ARGV[4], 'seq', seq, 'state', 'open', 'done', 0, 'failed', 0,
    'metadata', ARGV[5], 'created_at', ARGV[6], 'trainable', ARGV[7])
  redis.call('HINCRBY', KEYS[4], 'groups_open', 1)
end
redis.call('HSET', KEYS[3], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[1], 'group_id', ARGV[2], 'index', ARGV[3], 'group_size', ARGV[4], 'group_seq', seq,
  'status', 'pending', 'reward', '', 'metadata', ARGV[5], 'finish_metadata', '{}', 'created_at', ARGV[6], 'n_turns', 0,
  'owner', ARGV[8])
redis.call('HINCRBY', KEYS[4], 'sessions_open', 1)
return 1
""",
)

# ARGV: session_id, turn_index, payload
APPEND_TURN = LuaScript(
    TurnKeys,
    """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return redis.error_reply('NOSESSION unknown session ' .. ARGV[1]) end
local previous = redis.call('HGET', KEYS[2], ARGV[2])
if previous then
  if previous == ARGV[3] then return 0 end
  return redis.error_reply('CONFLICT turn ' .. ARGV[2] .. ' of session ' .. ARGV[1] .. ' was stored with other content')
end
if status ~= 'pending' then
  return redis.error_reply('FINISHED session ' .. ARGV[1] .. ' is ' .. status .. '; cannot append turn ' .. ARGV[2])
end
local n = tonumber(redis.call('HGET', KEYS[1], 'n_turns'))
if tonumber(ARGV[2]) ~= n then
  return redis.error_reply('BADINPUT session ' .. ARGV[1] .. ' has ' .. n .. ' turns; the next turn_index must be ' ..
    n .. ', got ' .. ARGV[2])
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[1], 'n_turns', n + 1)
redis.call('HINCRBY', KEYS[3], 'bytes_turns', #ARGV[3])
return 1
""",
)

# ARGV: session_id, n_turns, status, reward_json ('' = later), finish_metadata_json, now, then segment/blob pairs
FINISH_SESSION = LuaScript(
    FinishKeys,
    _MEMBER_DONE
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return redis.error_reply('NOSESSION unknown session ' .. ARGV[1]) end
if status ~= 'pending' then
  if status == ARGV[3] and redis.call('HGET', KEYS[1], 'reward') == ARGV[4] then return 0 end
  return redis.error_reply('FINISHED session ' .. ARGV[1] .. ' is already ' .. status)
end
if redis.call('HGET', KEYS[1], 'n_turns') ~= ARGV[2] then
  return redis.error_reply('CONFLICT turns were appended to session ' .. ARGV[1] .. ' while it was being finished')
end
local bytes = 0
for i = 7, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  bytes = bytes + #ARGV[i + 1]
end
redis.call('HSET', KEYS[1], 'status', ARGV[3], 'reward', ARGV[4], 'finish_metadata', ARGV[5], 'finished_at', ARGV[6])
redis.call('HINCRBY', KEYS[4], 'sessions_open', -1)
redis.call('HINCRBY', KEYS[4], ARGV[3] == 'failed' and 'sessions_failed' or 'sessions_finished', 1)
redis.call('HINCRBY', KEYS[4], 'bytes_samples', bytes)
if ARGV[3] == 'failed' or ARGV[4] ~= '' then
  member_done(redis.call('HGET', KEYS[1], 'group_id'), ARGV[3] == 'failed', ARGV[6])
end
return 1
""",
)

# ARGV: session_id, reward_json, now
SET_REWARD = LuaScript(
    FinishKeys,
    _MEMBER_DONE
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return redis.error_reply('NOSESSION unknown session ' .. ARGV[1]) end
if status == 'pending' or status == 'failed' then
  return redis.error_reply('BADINPUT session ' .. ARGV[1] .. ' is ' .. status .. '; a reward needs a finished session')
end
local reward = redis.call('HGET', KEYS[1], 'reward')
if reward ~= '' then
  if reward == ARGV[2] then return 0 end
  return redis.error_reply('CONFLICT session ' .. ARGV[1] .. ' already has reward ' .. reward)
end
if redis.call('HEXISTS', KEYS[1], 'retired_at') == 1 then
  return redis.error_reply('CONFLICT session ' .. ARGV[1] .. ' was retired from its group; its reward is not used')
end
redis.call('HSET', KEYS[1], 'reward', ARGV[2])
member_done(redis.call('HGET', KEYS[1], 'group_id'), false, ARGV[3])
return 1
""",
)

# Both check every group before changing any, so a batch is acknowledged (or given back) whole.
_CHECK_TAKEN = """
local function entry_if_taken(i, allow_trained)
  local gid = ARGV[i + 2]
  local state = redis.call('HGET', KEYS[i + 2], 'state')
  if not state then return nil, 'UNKNOWNGROUP unknown group ' .. gid end
  if state == 'trained' and allow_trained then return false end
  local entry = redis.call('HGET', KEYS[i + 2], 'entry')
  if state ~= 'ready' or #redis.call('XPENDING', KEYS[1], ARGV[1], entry, entry, 1) == 0 then
    return nil, 'NOTTAKEN group ' .. gid .. ' is ' .. state .. ' and not handed out'
  end
  return entry
end
local entries = {}
for i = 1, #KEYS - 2 do
  local entry, err = entry_if_taken(i, ALLOW_TRAINED)
  if err then return redis.error_reply(err) end
  entries[i] = entry
end
"""

# ARGV: consumer_group, now, group_id...
ACK = LuaScript(
    TakenKeys,
    "local ALLOW_TRAINED = true\n"
    + _CHECK_TAKEN
    + """
local done = 0
for i, entry in ipairs(entries) do
  if entry then
    redis.call('XACK', KEYS[1], ARGV[1], entry)
    redis.call('XDEL', KEYS[1], entry)
    redis.call('HSET', KEYS[i + 2], 'state', 'trained', 'trained_at', ARGV[2])
    done = done + 1
  end
end
redis.call('HINCRBY', KEYS[2], 'groups_trained', done)
return done
""",
)

# ARGV: consumer_group, now, group_id...
GIVE_BACK = LuaScript(
    TakenKeys,
    "local ALLOW_TRAINED = false\n"
    + _CHECK_TAKEN
    + """
for i, entry in ipairs(entries) do
  redis.call('XACK', KEYS[1], ARGV[1], entry)
  redis.call('XDEL', KEYS[1], entry)
  redis.call('HSET', KEYS[i + 2], 'entry', redis.call('XADD', KEYS[1], '*', 'group', ARGV[i + 2]))
end
redis.call('HINCRBY', KEYS[2], 'groups_given_back', #entries)
return #entries
""",
)

# Never hand out this group again: acknowledge its entry and record why.
# ARGV: entry_id, consumer_group, state, counter, now
DROP = LuaScript(
    DropKeys,
    """
if redis.call('XACK', KEYS[2], ARGV[2], ARGV[1]) == 0 then return 0 end
redis.call('XDEL', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'dropped_at', ARGV[5])
redis.call('HINCRBY', KEYS[3], ARGV[4], 1)
return 1
""",
)

# Stale members are generated again in the same group: acknowledge the entry, free their indices
# (their sessions stay stored, marked retired, and are never trained on), put the group back to
# open with that many members still to come, and queue the regeneration request.
# ARGV: entry_id, consumer_group, regenerate_json, now, index... (one per session key)
REOPEN = LuaScript(
    ReopenKeys,
    """
if redis.call('XACK', KEYS[3], ARGV[2], ARGV[1]) == 0 then return 0 end
redis.call('XDEL', KEYS[3], ARGV[1])
local n = #ARGV - 4
for i = 1, n do
  redis.call('HDEL', KEYS[2], ARGV[i + 4])
  redis.call('HSET', KEYS[i + 5], 'retired_at', ARGV[4])
end
redis.call('HINCRBY', KEYS[1], 'done', -n)
redis.call('HINCRBY', KEYS[1], 'reopened', 1)
redis.call('HSET', KEYS[1], 'state', 'open')
redis.call('HDEL', KEYS[1], 'entry')
redis.call('HINCRBY', KEYS[4], 'groups_open', 1)
redis.call('HINCRBY', KEYS[4], 'groups_reopened', 1)
redis.call('HINCRBY', KEYS[4], 'members_regenerated', n)
redis.call('RPUSH', KEYS[5], ARGV[3])
return 1
""",
)

# After the rollout side died: free the places of an open training group that can no longer be
# filled, and answer every free index, for the caller to queue. Sessions still open are closed as
# aborted and retired; sessions finished without a reward are retired too, since the process that
# would have set it died with them. Idempotent: a second run finds the same indices free.
# ARGV: now, then index/session_id pairs as read from the members hash
RECOVER = LuaScript(
    RecoverKeys,
    _ABORT_MEMBER
    + """
if redis.call('HGET', KEYS[1], 'state') ~= 'open' or redis.call('HGET', KEYS[1], 'trainable') == '0' then
  return {}
end
local filled = {}
for i = 1, #KEYS - 3 do
  local index, sid = ARGV[2 * i], ARGV[2 * i + 1]
  if redis.call('HGET', KEYS[2], index) == sid then
    local status, reward = unpack(redis.call('HMGET', KEYS[i + 3], 'status', 'reward'))
    if status == 'pending' then
      abort_member(KEYS[2], index, KEYS[i + 3], KEYS[3], ARGV[1])
    elseif status ~= 'failed' and reward == '' then
      redis.call('HDEL', KEYS[2], index)
      redis.call('HSET', KEYS[i + 3], 'retired_at', ARGV[1])
    else
      filled[tonumber(index)] = true
    end
  end
end
local free = {}
for index = 0, tonumber(redis.call('HGET', KEYS[1], 'size')) - 1 do
  if not filled[index] then free[#free + 1] = index end
end
return free
""",
)

# One router's recovery: only the sessions it opened (owner = its id) that are still open are
# closed as aborted, and their places returned; the other routers' live sessions, and members
# whose reward the rollout side still sets, are left alone.
# ARGV: now, owner, then index/session id pairs
RECOVER_OWNED = LuaScript(
    RecoverKeys,
    _ABORT_MEMBER
    + """
if redis.call('HGET', KEYS[1], 'state') ~= 'open' or redis.call('HGET', KEYS[1], 'trainable') == '0' then
  return {}
end
local free = {}
for i = 1, #KEYS - 3 do
  local index, sid = ARGV[2 * i + 1], ARGV[2 * i + 2]
  if redis.call('HGET', KEYS[2], index) == sid then
    local status, owner = unpack(redis.call('HMGET', KEYS[i + 3], 'status', 'owner'))
    if status == 'pending' and owner == ARGV[2] then
      abort_member(KEYS[2], index, KEYS[i + 3], KEYS[3], ARGV[1])
      free[#free + 1] = tonumber(index)
    end
  end
end
return free
""",
)

# The rollout side lost an episode to its infrastructure (a worker or node died): the session is
# closed as aborted and retired, and its place freed, so the episode is generated again in the
# same group at the same index. 0 (nothing changed) if the session is no longer open or no longer
# holds its place (already aborted, finished, or freed by a recovery).
# ARGV: session_id, now
ABORT_SESSION = LuaScript(
    AbortKeys,
    _ABORT_MEMBER
    + """
local status, index = unpack(redis.call('HMGET', KEYS[1], 'status', 'index'))
if not status then return redis.error_reply('NOSESSION unknown session ' .. ARGV[1]) end
if status ~= 'pending' or redis.call('HGET', KEYS[2], index) ~= ARGV[1] then return 0 end
abort_member(KEYS[2], index, KEYS[1], KEYS[3], ARGV[2])
return 1
""",
)
