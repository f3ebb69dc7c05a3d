"""The records the router writes and the trainer reads: `SessionInfo`, `Turn`, `Group`.

A session is one episode of one agent; it belongs to a group (the n answers to one prompt).
A turn is one generation call: `prompt_ids` are only the tokens appended before this turn's
generation (the whole prompt for a segment's first turn), so a segment's tokens are the
concatenation of `prompt_ids + output_ids` over its turns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from buffer.errors import BufferInputError
from slimeish.types import Sample


class SessionStatus(StrEnum):
    """How a session ended; the values match `Sample.Status` (plus `open`)."""

    OPEN = "open"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass(slots=True)
class SessionInfo:
    session_id: str
    group_id: str
    index: int  # position in the group, 0 <= index < group_size
    group_size: int
    metadata: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if not self.session_id or not self.group_id:
            raise BufferInputError("session_id and group_id must be non-empty")
        if self.group_size < 1 or not 0 <= self.index < self.group_size:
            raise BufferInputError(f"need 0 <= index < group_size, got index={self.index} group_size={self.group_size}")


@dataclass(slots=True)
class Turn:
    session_id: str
    turn_index: int  # 0, 1, 2, ... in the order the turns happened
    segment_index: int  # which sample this turn belongs to; a new segment starts a new sample
    split_reason: str | None  # why this turn started a new segment (None when it continues one)
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]  # one per output id: the engine's log-prob of the sampled token
    weight_versions: list[int]  # weight versions that generated output_ids (several if it spans an update)
    engine: str = ""
    finish_reason: str = ""  # "stop" | "length" | "abort"
    started_at: float = 0.0
    finished_at: float = 0.0

    def validate(self) -> None:
        """Raise BufferInputError if the arrays of this turn disagree."""
        where = f"session {self.session_id!r} turn {self.turn_index}"
        if self.turn_index < 0 or self.segment_index < 0:
            raise BufferInputError(f"{where}: turn_index and segment_index must be >= 0")
        if len(self.output_logprobs) != len(self.output_ids):
            raise BufferInputError(
                f"{where}: {len(self.output_ids)} output_ids but {len(self.output_logprobs)} output_logprobs"
                " (every sampled token needs its log-prob)"
            )
        if any(t < 0 for t in self.prompt_ids) or any(t < 0 for t in self.output_ids):
            raise BufferInputError(f"{where}: token ids must be >= 0")
        if not all(math.isfinite(lp) and lp <= 0.0 for lp in self.output_logprobs):
            raise BufferInputError(f"{where}: output_logprobs must be finite and <= 0")
        if self.output_ids and not self.weight_versions:
            raise BufferInputError(f"{where}: output_ids need the weight_versions that produced them")


@dataclass(slots=True)
class Group:
    """A complete group handed to a trainer by `Buffer.take_groups`; acknowledge it by `group_id`."""

    group_id: str
    samples: list[Sample]  # ordered by (index in group, segment index); failed members have none
    metadata: dict[str, Any]  # the metadata of the group's first opened session
    entry_id: str  # the stream entry under which it was handed out


@dataclass(slots=True)
class RegenerateRequest:
    """A group dropped as too stale: its prompt should be generated again."""

    group_id: str
    metadata: dict[str, Any]
    oldest_version: int
    current_version: int
