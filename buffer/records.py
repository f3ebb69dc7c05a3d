"""The records the router writes and the trainer reads: `SessionInfo`, `Turn`, `Group`.

A session is one episode of one agent; it belongs to a group (the n answers to one prompt).
A turn is one generation call: `prompt_ids` are only the tokens appended before this turn's
generation (the whole prompt for a segment's first turn), so a segment's tokens are the
concatenation of `prompt_ids + output_ids` over its turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from slimeish.buffer.errors import BufferInputError
from slimeish.common.sample import Sample

_MAX_TOKEN_ID = 2**31 - 1  # stored as int32


@dataclass(slots=True)
class SessionInfo:
    session_id: str
    group_id: str
    index: int  # position in the group, 0 <= index < group_size
    group_size: int
    metadata: dict[str, Any] = field(default_factory=dict)
    trainable: bool = True  # False: an evaluation episode; its group is stored, never handed to a trainer
    owner: str = ""  # the router that opened it (its --router-id): that router's recovery closes only its own

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
    # the router's parse of the reply's tool-call markup: why it failed ("malformed" | "truncated"),
    # None when it parsed or no tools were offered; and how many calls it parsed
    parse_failure: str | None = None
    tool_calls: int = 0
    # the line of segments this turn's segment belongs to: the agent (system prompt + tools) that
    # sent it, numbered in order of appearance; a sub-agent's turns have their own line
    lineage: int = 0
    # MoE routing replay: the engine's expert ids for this turn's tokens (prompt_ids + output_ids,
    # less the last output token, plus the previous turn's last output token when it continues a
    # segment), int16 bytes in (token, layer, top-k) order (slimeish.common.routed_experts)
    routed_experts: bytes | None = None

    def validate(self) -> None:
        """Raise BufferInputError if the arrays of this turn disagree."""
        self.pack()

    def pack(self) -> PackedTurn:
        """Validate and convert to numpy arrays, one vectorised pass per array (no per-token Python).
        Every turn the router stores is packed, so the checks are the cheapest numpy has for short
        arrays: a min and a max (NaN propagates into both) rather than element-wise masks."""
        where = f"session {self.session_id!r} turn {self.turn_index}"
        if self.turn_index < 0 or self.segment_index < 0 or self.lineage < 0:
            raise BufferInputError(f"{where}: turn_index, segment_index and lineage must be >= 0")
        if len(self.output_logprobs) != len(self.output_ids):
            raise BufferInputError(
                f"{where}: {len(self.output_ids)} output_ids but {len(self.output_logprobs)} output_logprobs"
                " (every sampled token needs its log-prob)"
            )
        if self.parse_failure is not None and (not isinstance(self.parse_failure, str) or not self.parse_failure):
            raise BufferInputError(f"{where}: parse_failure must be None or a non-empty reason")
        if isinstance(self.tool_calls, bool) or not isinstance(self.tool_calls, int) or self.tool_calls < 0:
            raise BufferInputError(f"{where}: tool_calls must be a count >= 0, got {self.tool_calls!r}")
        if self.routed_experts is not None and (
            not isinstance(self.routed_experts, bytes) or len(self.routed_experts) % 2
        ):
            raise BufferInputError(f"{where}: routed_experts must be int16 bytes")
        if self.output_ids and not self.weight_versions:
            raise BufferInputError(f"{where}: output_ids need the weight_versions that produced them")
        logprobs = _array(self.output_logprobs, np.float64, where, "output_logprobs")
        if logprobs.size and not (logprobs.max() <= 0.0 and logprobs.min() > -np.inf):
            raise BufferInputError(f"{where}: output_logprobs must be finite and <= 0")
        return PackedTurn(
            session_id=self.session_id,
            turn_index=self.turn_index,
            segment_index=self.segment_index,
            split_reason=self.split_reason,
            prompt_ids=_token_ids(self.prompt_ids, where, "prompt_ids"),
            output_ids=_token_ids(self.output_ids, where, "output_ids"),
            output_logprobs=logprobs.astype(np.float32),
            weight_versions=list(self.weight_versions),
            engine=self.engine,
            finish_reason=self.finish_reason,
            started_at=self.started_at,
            finished_at=self.finished_at,
            parse_failure=self.parse_failure,
            tool_calls=self.tool_calls,
            lineage=self.lineage,
            routed_experts=self.routed_experts,
        )


def _array(values: Sequence[float], dtype: type, where: str, name: str) -> np.ndarray:
    try:
        array: np.ndarray = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BufferInputError(f"{where}: {name} must be a flat list of numbers ({exc})") from None
    if array.ndim != 1:
        raise BufferInputError(f"{where}: {name} must be a flat list of numbers")
    return array


def _token_ids(values: list[int], where: str, name: str) -> np.ndarray:
    ids = _array(values, np.int64, where, name)
    # one reduction for both bounds: read as unsigned, a negative id is above any valid one
    if ids.size and ids.view(np.uint64).max() > _MAX_TOKEN_ID:
        raise BufferInputError(f"{where}: {name} must be token ids in [0, {_MAX_TOKEN_ID}]")
    return ids.astype(np.int32)


@dataclass(slots=True)
class PackedTurn:
    """A validated turn with numpy arrays (int32 ids, float32 log-probs): what is stored and sealed."""

    session_id: str
    turn_index: int
    segment_index: int
    split_reason: str | None
    prompt_ids: np.ndarray
    output_ids: np.ndarray
    output_logprobs: np.ndarray
    weight_versions: list[int]
    engine: str
    finish_reason: str
    started_at: float
    finished_at: float
    parse_failure: str | None = None  # defaults: a turn stored before these fields decodes as parsed
    tool_calls: int = 0
    lineage: int = 0
    routed_experts: bytes | None = None

    def to_turn(self) -> Turn:
        return Turn(
            self.session_id,
            self.turn_index,
            self.segment_index,
            self.split_reason,
            self.prompt_ids.tolist(),
            self.output_ids.tolist(),
            self.output_logprobs.tolist(),
            self.weight_versions,
            self.engine,
            self.finish_reason,
            self.started_at,
            self.finished_at,
            self.parse_failure,
            self.tool_calls,
            self.lineage,
            self.routed_experts,
        )


@dataclass(slots=True)
class Group:
    """A complete group handed to a trainer by `Buffer.take_groups`; acknowledge it by `group_id`."""

    group_id: str
    samples: list[Sample]  # ordered by (index in group, segment index); failed members have none
    metadata: dict[str, Any]  # the metadata of the group's first opened session
    entry_id: str  # the stream entry under which it was handed out


@dataclass(slots=True)
class TakeResult:
    """What one `Buffer.take_groups` call settled: the groups it handed out, and the groups it
    settled without handing them out. Either way their rollout slots are free again."""

    groups: list[Group] = field(default_factory=list)
    reopened: int = 0  # groups with stale members, reopened; those members come back to be regenerated
    regenerated: int = 0  # members of the reopened groups queued to be generated again
    dropped_stale: int = 0  # groups too stale to reopen
    dropped_failed: int = 0  # groups with too many failed members
    filtered: int = 0  # groups the group filter refused

    def count_skip(self, state: str, regenerated: int = 0) -> None:
        """Count a group settled without handing it out, by its verdict state (see buffer/rules.py)."""
        if state == "reopen":
            self.reopened += 1
            self.regenerated += regenerated
        elif state == "dropped_stale":
            self.dropped_stale += 1
        elif state == "dropped_failed":
            self.dropped_failed += 1
        elif state == "filtered":
            self.filtered += 1
        else:
            raise AssertionError(f"not a skip: {state!r}")

    @property
    def settled(self) -> int:
        """Groups taken or skipped: how many rollout slots this take frees."""
        return len(self.groups) + self.reopened + self.dropped_stale + self.dropped_failed + self.filtered

    def counters(self) -> dict[str, int]:
        """The skips under the names of their `buffer/...` metrics and `BufferStats` counters."""
        return {
            "groups_reopened": self.reopened,
            "members_regenerated": self.regenerated,
            "groups_dropped_stale": self.dropped_stale,
            "groups_dropped_failed": self.dropped_failed,
            "groups_filtered": self.filtered,
        }


@dataclass(slots=True)
class RegenerateRequest:
    """Members of a group to generate again, at the same indices of the same group (the group's
    first session's metadata says what to generate): stale members of a reopened group, or the
    places a crashed rollout side left unfilled."""

    group_id: str
    metadata: dict[str, Any]
    indices: list[int]
    oldest_version: int | None  # the stale members' oldest token (None: recovered after a crash)
    current_version: int | None
