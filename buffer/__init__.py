"""The Redis data buffer: sessions, turns, samples and GRPO groups, durable across crashes.

Public API (documented in docs/buffer.md):
- `Buffer(url, run_id, config)`: open_session / append_turn / finish_session / fail_session /
  set_reward (writers); take_groups / ack / give_back / pop_regenerate (trainer); stats.
- records `SessionInfo`, `Turn`, `Group`, `RegenerateRequest`, `SessionStatus`; `BufferConfig`.
- `EmbeddedServer(dir, port)`: the valkey-server slimeish starts when no --buffer-url is given.
"""

from slimeish.buffer.client import Buffer
from slimeish.buffer.config import BufferConfig
from slimeish.buffer.errors import (
    BufferInputError,
    ConflictError,
    NotTakenError,
    SessionFinishedError,
    UnknownGroupError,
    UnknownSessionError,
)
from slimeish.buffer.records import Group, RegenerateRequest, SessionInfo, SessionStatus, Turn
from slimeish.buffer.segments import build_samples
from slimeish.buffer.server import EmbeddedServer, ServerConfig
from slimeish.buffer.stats import BufferStats

__all__ = [
    "Buffer",
    "BufferConfig",
    "BufferInputError",
    "BufferStats",
    "ConflictError",
    "EmbeddedServer",
    "Group",
    "NotTakenError",
    "RegenerateRequest",
    "ServerConfig",
    "SessionFinishedError",
    "SessionInfo",
    "SessionStatus",
    "Turn",
    "UnknownGroupError",
    "UnknownSessionError",
    "build_samples",
]
