"""Lua scripts for the writes that must happen together (Redis runs each one atomically): here
those that write one session; group_scripts.py holds those that settle whole groups.

Each script checks its preconditions before its first write, so a refused call changes nothing.
Errors are replied as "<CODE> message" (codes in buffer/errors.py). All keys come from KEYS,
built by buffer/keys.py. A session's `status` is a `Sample.Status` value ('pending' while it is
open); a group's `state` is the group's own ('open', 'ready', 'trained', ...).

Each script is a `LuaScript` paired with a NamedTuple of its KEYS (at the top of its module) and
one of its ARGV (right above it): the Lua reads both by position, so a tuple's field order is
that position, and a caller names every key and argument it passes (`ScriptBatcher.run` takes
only the script's own types).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

K = TypeVar("K", bound=tuple[Any, ...])
A = TypeVar("A", bound=tuple[Any, ...])


@dataclass(frozen=True, slots=True)
class LuaScript(Generic[K, A]):
    """KEYS[1] is the first field of `keys`, ARGV[1] the first of `args`; a last field that is a
    tuple is spread (one key or argument per item)."""

    keys: type[K]
    args: type[A]
    source: str


def spread(fields: tuple[Any, ...]) -> list[Any]:
    """A keys or args tuple as the flat list Redis takes."""
    *fixed, last = fields
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
ABORT_MEMBER = """
local function abort_member(members, index, session, stats, now)
  redis.call('HDEL', members, index)
  redis.call('HSET', session, 'status', 'aborted', 'finished_at', now, 'retired_at', now)
  redis.call('HINCRBY', stats, 'sessions_open', -1)
  redis.call('HINCRBY', stats, 'sessions_finished', 1)
end
"""


class OpenArgs(NamedTuple):
    session_id: str
    group_id: str
    member_index: int  # its place in the group (a NamedTuple field cannot be named `index`)
    group_size: int
    metadata_json: bytes
    now: float
    trainable: int  # 1, or 0 for an evaluation episode
    owner: str


OPEN_SESSION = LuaScript(
    SessionKeys,
    OpenArgs,
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


class AppendArgs(NamedTuple):
    session_id: str
    turn_index: int
    payload: bytes
    epoch: int  # the session's write epoch the writer knows: a write from before a `REVOKE_TURNS` is refused


APPEND_TURN = LuaScript(
    TurnKeys,
    AppendArgs,
    """
local status, epoch = unpack(redis.call('HMGET', KEYS[1], 'status', 'epoch'))
if not status then return redis.error_reply('NOSESSION unknown session ' .. ARGV[1]) end
if (epoch or '0') ~= ARGV[4] then
  return redis.error_reply('STALE turn ' .. ARGV[2] .. ' of session ' .. ARGV[1] .. ' was written at epoch ' ..
    ARGV[4] .. ', revoked since (the session is at epoch ' .. (epoch or '0') .. ')')
end
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


class RevokeArgs(NamedTuple):
    session_id: str
    from_index: int
    epoch: int  # the epoch the session moves to: writes sent before it are refused


# The turns from `from_index` on are dropped, and the session moves to a new write epoch, so a
# write of them still on its way (sent to a stalled server) is refused when it arrives: a turn
# whose client was told it failed is never stored, whichever of the two the server runs first.
# A retry (the session already at the epoch) changes nothing.
REVOKE_TURNS = LuaScript(
    TurnKeys,
    RevokeArgs,
    """
local status, n, epoch = unpack(redis.call('HMGET', KEYS[1], 'status', 'n_turns', 'epoch'))
if not status then return redis.error_reply('NOSESSION unknown session ' .. ARGV[1]) end
if tonumber(epoch or '0') >= tonumber(ARGV[3]) then return 0 end
if status ~= 'pending' then
  return redis.error_reply('FINISHED session ' .. ARGV[1] .. ' is ' .. status .. '; cannot revoke its turns')
end
local from = tonumber(ARGV[2])
for i = from, tonumber(n) - 1 do
  local payload = redis.call('HGET', KEYS[2], i)
  if payload then
    redis.call('HDEL', KEYS[2], i)
    redis.call('HINCRBY', KEYS[3], 'bytes_turns', -#payload)
  end
end
redis.call('HSET', KEYS[1], 'n_turns', math.min(from, tonumber(n)), 'epoch', ARGV[3])
return 1
""",
)


class FinishArgs(NamedTuple):
    session_id: str
    n_turns: int
    status: str
    reward_json: bytes  # b'' = set later
    metadata_json: bytes
    now: float
    samples: tuple[int | bytes, ...]  # segment index, sample header, ...


FINISH_SESSION = LuaScript(
    FinishKeys,
    FinishArgs,
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


class RewardArgs(NamedTuple):
    session_id: str
    reward_json: bytes
    now: float


SET_REWARD = LuaScript(
    FinishKeys,
    RewardArgs,
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


# The rollout side lost an episode to its infrastructure (a worker or node died): the session is
# closed as aborted and retired, and its place freed, so the episode is generated again in the
# same group at the same index. 0 (nothing changed) if the session is no longer open or no longer
# holds its place (already aborted, finished, or freed by a recovery).
class AbortArgs(NamedTuple):
    session_id: str
    now: float


ABORT_SESSION = LuaScript(
    AbortKeys,
    AbortArgs,
    ABORT_MEMBER
    + """
local status, index = unpack(redis.call('HMGET', KEYS[1], 'status', 'index'))
if not status then return redis.error_reply('NOSESSION unknown session ' .. ARGV[1]) end
if status ~= 'pending' or redis.call('HGET', KEYS[2], index) ~= ARGV[1] then return 0 end
abort_member(KEYS[2], index, KEYS[1], KEYS[3], ARGV[2])
return 1
""",
)
