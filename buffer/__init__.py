"""The Redis data buffer: sessions, turns, samples and GRPO groups, durable across crashes.

Public API (documented in docs/buffer.md):
- `Buffer(url, run_id, config)`: open_session / append_turn / finish_session / fail_session /
  set_reward (writers); take_groups / ack / give_back / pop_regenerate (trainer); stats;
  read-only inspection: counters / groups / sessions / session / open_sessions (views without
  token arrays: `GroupView`, `SessionView`, `SegmentView`), turns / session_samples, `run_ids(url)`.
  `take_groups` returns a `TakeResult` (the groups, and what the take settled without handing out).
- records `SessionInfo`, `Turn`, `Group`, `RegenerateRequest`, `TakeResult`; `BufferConfig`. A
  session's status is `slimeish.common.sample.Status` (PENDING while it is open).
- `build_samples`: a session's turns to its samples, by the buffer's segment rules (for a store
  that keeps sessions in memory).
- `EmbeddedServer(dir, port)`: the valkey-server slimeish starts when no --buffer-url is given;
  `connect_or_start(url, dir)`: a URL, else the server running on `dir`, else one started there.
"""

from slimeish.buffer.client import Buffer, run_ids
from slimeish.buffer.config import BufferConfig
from slimeish.buffer.errors import (
    BufferInputError,
    ConflictError,
    NotTakenError,
    SessionFinishedError,
    StaleWriteError,
    UnknownGroupError,
    UnknownSessionError,
)
from slimeish.buffer.records import Group, RegenerateRequest, SessionInfo, TakeResult, Turn
from slimeish.buffer.segments import build_samples
from slimeish.buffer.server import EmbeddedServer, ServerConfig, connect_or_start
from slimeish.buffer.stats import BufferStats
from slimeish.buffer.views import GroupView, SegmentView, SessionView

__all__ = [
    "Buffer",
    "BufferConfig",
    "BufferInputError",
    "BufferStats",
    "ConflictError",
    "EmbeddedServer",
    "Group",
    "GroupView",
    "NotTakenError",
    "RegenerateRequest",
    "SegmentView",
    "ServerConfig",
    "SessionFinishedError",
    "SessionInfo",
    "SessionView",
    "StaleWriteError",
    "TakeResult",
    "Turn",
    "UnknownGroupError",
    "UnknownSessionError",
    "build_samples",
    "connect_or_start",
    "run_ids",
]
