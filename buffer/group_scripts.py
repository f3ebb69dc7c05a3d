"""Lua scripts that settle whole groups: the trainer's acknowledgements, give-backs, drops and
reopens, and the recoveries after the rollout side or a router died. Written as scripts.py's are
(its docstring says how); the scripts that write one session are there.
"""

from __future__ import annotations

from typing import NamedTuple

from slimeish.buffer.scripts import ABORT_MEMBER, LuaScript


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


class TakenArgs(NamedTuple):
    consumer_group: str
    now: float
    group_ids: tuple[str, ...]


ACK = LuaScript(
    TakenKeys,
    TakenArgs,
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

GIVE_BACK = LuaScript(
    TakenKeys,
    TakenArgs,
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
class DropArgs(NamedTuple):
    entry_id: str
    consumer_group: str
    state: str
    counter: str
    now: float


DROP = LuaScript(
    DropKeys,
    DropArgs,
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
class ReopenArgs(NamedTuple):
    entry_id: str
    consumer_group: str
    regenerate_json: bytes
    now: float
    indices: tuple[int, ...]  # one per session key


REOPEN = LuaScript(
    ReopenKeys,
    ReopenArgs,
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


# The recovery scripts' shared reading of RecoverKeys: whether the group can still be filled, and
# which of the (index, session id) pairs in ARGV, from ARGV[first], still hold their place.
_HELD_MEMBERS = """
local function open_and_trainable()
  return redis.call('HGET', KEYS[1], 'state') == 'open' and redis.call('HGET', KEYS[1], 'trainable') ~= '0'
end
local function held_members(first)
  local held = {}
  for i = 1, #KEYS - 3 do
    local index, sid = ARGV[first + 2 * (i - 1)], ARGV[first + 2 * (i - 1) + 1]
    if redis.call('HGET', KEYS[2], index) == sid then held[#held + 1] = {index, KEYS[i + 3]} end
  end
  return held
end
"""


# After the rollout side died: free the places of an open training group that can no longer be
# filled, and answer every free index, for the caller to queue. Sessions still open are closed as
# aborted and retired; sessions finished without a reward are retired too, since the process that
# would have set it died with them. Idempotent: a second run finds the same indices free.
class RecoverArgs(NamedTuple):
    now: float
    held: tuple[int | str, ...]  # index, session id, ... as read from the members hash


RECOVER = LuaScript(
    RecoverKeys,
    RecoverArgs,
    ABORT_MEMBER
    + _HELD_MEMBERS
    + """
if not open_and_trainable() then return {} end
local filled = {}
for _, held in ipairs(held_members(2)) do
  local index, member = held[1], held[2]
  local status, reward = unpack(redis.call('HMGET', member, 'status', 'reward'))
  if status == 'pending' then
    abort_member(KEYS[2], index, member, KEYS[3], ARGV[1])
  elseif status ~= 'failed' and reward == '' then
    redis.call('HDEL', KEYS[2], index)
    redis.call('HSET', member, 'retired_at', ARGV[1])
  else
    filled[tonumber(index)] = true
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
class RecoverOwnedArgs(NamedTuple):
    now: float
    owner: str
    held: tuple[int | str, ...]  # index, session id, ... as RECOVER


RECOVER_OWNED = LuaScript(
    RecoverKeys,
    RecoverOwnedArgs,
    ABORT_MEMBER
    + _HELD_MEMBERS
    + """
if not open_and_trainable() then return {} end
local free = {}
for _, held in ipairs(held_members(3)) do
  local index, member = held[1], held[2]
  local status, owner = unpack(redis.call('HMGET', member, 'status', 'owner'))
  if status == 'pending' and owner == ARGV[2] then
    abort_member(KEYS[2], index, member, KEYS[3], ARGV[1])
    free[#free + 1] = tonumber(index)
  end
end
return free
""",
)
