"""Turn a finished session's turns into one sample per segment (pure, no Redis).

Conventions (slimeish.common.sample.Sample): `tokens` = prompt_ids + output_ids over the segment's
turns; the response is everything after the first turn's prompt_ids; the loss mask is 1 exactly
on output_ids; the log-prob is 0.0 wherever the mask is 0. Built with numpy from the packed
turns, so sealing costs a few array concatenations, not a loop over tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from slimeish.buffer.errors import BufferInputError
from slimeish.buffer.records import PackedTurn
from slimeish.common.routed_experts import join_turn_rows
from slimeish.common.sample import TEACHER_LOG_PROBS, Sample

# The metadata key of a sample's tool-call parse outcome over its turns (see `tool_parse`).
TOOL_PARSE = "tool_parse"
# The metadata key of a sample's lineage (`Turn.lineage`), set on every sample of a session whose
# turns came from several agents (a sub-agent's segments are a line of their own).
LINEAGE = "lineage"


@dataclass(slots=True)
class PackedSample:
    """A `Sample` with numpy arrays and without its reward: the stored form."""

    group_index: int
    index: int
    tokens: np.ndarray  # int32
    response_length: int
    loss_mask: np.ndarray  # uint8
    rollout_log_probs: np.ndarray  # float32
    weight_versions: list[int]
    status: str
    metadata: dict[str, Any]
    session_id: str
    segment_index: int
    split_reason: str | None
    # an OPD teacher's log-prob per response token (float32 bytes), given at finish; None without
    teacher_log_probs: bytes | None = None
    # base64 int32 expert ids of tokens[:-1] (Sample.rollout_routed_experts), rebuilt from the turns
    rollout_routed_experts: str | None = None

    def to_sample(self, reward: float | None) -> Sample:
        teacher = self.teacher_log_probs
        return Sample(
            group_index=self.group_index,
            index=self.index,
            tokens=self.tokens.tolist(),
            response_length=self.response_length,
            loss_mask=self.loss_mask.tolist(),
            rollout_log_probs=self.rollout_log_probs.tolist(),
            weight_versions=self.weight_versions,
            status=Sample.Status(self.status),
            metadata=self.metadata,
            teacher_log_probs=None if teacher is None else np.frombuffer(teacher, "<f4").tolist(),
            rollout_routed_experts=self.rollout_routed_experts,
            reward=reward,
            session_id=self.session_id,
            segment_index=self.segment_index,
            split_reason=self.split_reason,
        )


def check_next_turn(previous: PackedTurn | None, turn: PackedTurn, segments: int) -> None:
    """Refuse a turn that cannot follow `previous` (None: `turn` must be the session's first), the
    earlier turns holding `segments` segments: it continues one of them (segments of several
    lineages interleave) or starts the next."""
    where = f"session {turn.session_id!r} turn {turn.turn_index}"
    if turn.turn_index and previous is None:
        raise BufferInputError(f"{where}: turn {turn.turn_index - 1} was never appended")
    if not 0 <= turn.segment_index <= segments:
        raise BufferInputError(f"{where}: segment_index {turn.segment_index}, expected 0 to {segments}")
    if turn.segment_index == segments and not len(turn.prompt_ids):
        raise BufferInputError(f"{where} starts segment {turn.segment_index} but has no prompt_ids")


def split_segments(turns: list[PackedTurn]) -> list[list[PackedTurn]]:
    """Group turns (ordered by turn_index) by segment, checking the order once more."""
    segments: list[list[PackedTurn]] = []
    for position, turn in enumerate(turns):
        if turn.turn_index != position:
            raise BufferInputError(f"session {turn.session_id!r}: turn {position} is missing")
        check_next_turn(turns[position - 1] if position else None, turn, len(segments))
        if turn.segment_index == len(segments):
            segments.append([turn])
        else:
            segments[turn.segment_index].append(turn)
    return segments


def build_sample(
    segment: list[PackedTurn], *, status: str, index: int, group_index: int, metadata: dict[str, Any]
) -> PackedSample:
    """One training sample from the turns of one segment."""
    first, rest = segment[0], segment[1:]
    response_parts = [first.output_ids]
    mask_parts = [np.ones(len(first.output_ids), np.uint8)]
    logprob_parts = [first.output_logprobs]
    for turn in rest:  # tokens given to the model between turns (tool results, user messages): mask 0
        response_parts += [turn.prompt_ids, turn.output_ids]
        mask_parts += [np.zeros(len(turn.prompt_ids), np.uint8), np.ones(len(turn.output_ids), np.uint8)]
        logprob_parts += [np.zeros(len(turn.prompt_ids), np.float32), turn.output_logprobs]
    response = np.concatenate(response_parts)
    return PackedSample(
        group_index=group_index,
        index=index,
        tokens=np.concatenate([first.prompt_ids, response]),
        response_length=len(response),
        loss_mask=np.concatenate(mask_parts),
        rollout_log_probs=np.concatenate(logprob_parts),
        weight_versions=sorted({v for turn in segment for v in turn.weight_versions}),
        status=status,
        metadata=_with_tool_parse(metadata, segment),
        session_id=first.session_id,
        segment_index=first.segment_index,
        split_reason=first.split_reason,
        rollout_routed_experts=_routes(segment),
    )


def _routes(segment: list[PackedTurn]) -> str | None:
    """The segment's routed experts, when every turn of it recorded them."""
    parts = [turn.routed_experts for turn in segment if turn.routed_experts is not None]
    return join_turn_rows(parts) if len(parts) == len(segment) else None


def tool_parse(segment: list[PackedTurn]) -> dict[str, Any] | None:
    """The tool calls the router parsed from the segment's replies and its parse failures by
    reason: `{"calls": 2, "failures": {"malformed": 1}}`; None when no reply had either."""
    failures: dict[str, int] = {}
    for turn in segment:
        if turn.parse_failure is not None:
            failures[turn.parse_failure] = failures.get(turn.parse_failure, 0) + 1
    calls = sum(turn.tool_calls for turn in segment)
    return {"calls": calls, "failures": failures} if calls or failures else None


def _with_tool_parse(metadata: dict[str, Any], segment: list[PackedTurn]) -> dict[str, Any]:
    outcome = tool_parse(segment)
    return metadata if outcome is None else {**metadata, TOOL_PARSE: outcome}


def build_samples(
    turns: list[PackedTurn], *, status: str, index: int, group_index: int, metadata: dict[str, Any]
) -> list[PackedSample]:
    """All samples of a session; a failed session has none (it is never trained on)."""
    if status == Sample.Status.FAILED.value:
        return []
    metadata, teacher = split_teacher_log_probs(metadata)
    lineages = any(turn.lineage for turn in turns)  # recorded on each sample where a session has several
    samples = []
    for i, segment in enumerate(split_segments(turns)):
        sample_metadata = {**metadata, LINEAGE: segment[0].lineage} if lineages else metadata
        sample = build_sample(segment, status=status, index=index, group_index=group_index, metadata=sample_metadata)
        if i < len(teacher) and teacher[i] is not None:
            sample.teacher_log_probs = np.asarray(teacher[i], "<f4").tobytes()
        samples.append(sample)
    return samples


def split_teacher_log_probs(metadata: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """Finish metadata without its OPD teacher log-probs, and those (one list per segment): they
    are stored as arrays on the samples, not as JSON beside them."""
    if TEACHER_LOG_PROBS not in metadata:
        return metadata, []
    return {k: v for k, v in metadata.items() if k != TEACHER_LOG_PROBS}, list(metadata[TEACHER_LOG_PROBS])


def assemble(turns: list[PackedTurn], headers: list[dict[str, Any]], reward: float | None) -> list[Sample]:
    """Rebuild stored samples (headers written at finish) from the session's turns."""
    segments = split_segments(turns)
    samples = []
    for header in sorted(headers, key=lambda h: h["segment_index"]):
        fields = {name: header[name] for name in ("status", "index", "group_index", "metadata")}
        packed = build_sample(segments[header["segment_index"]], **fields)
        packed.teacher_log_probs = header.get("teacher_log_probs")
        assert packed.response_length == header["response_length"], "turns changed after the session was sealed"
        samples.append(packed.to_sample(reward))
    return samples
