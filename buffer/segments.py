"""Turn a finished session's turns into one `Sample` per segment (pure, no Redis).

Conventions (slimeish.types.Sample): `tokens` = prompt_ids + output_ids over the segment's
turns; the response is everything after the first turn's prompt_ids; the loss mask is 1 exactly
on output_ids; the log-prob is 0.0 wherever the mask is 0.
"""

from __future__ import annotations

from typing import Any

from buffer.errors import BufferInputError
from buffer.records import Turn
from slimeish.types import Sample


def check_next_turn(previous: Turn | None, turn: Turn) -> None:
    """Refuse a turn that cannot follow `previous` (None: `turn` must be the session's first)."""
    where = f"session {turn.session_id!r} turn {turn.turn_index}"
    expected = {0} if previous is None else {previous.segment_index, previous.segment_index + 1}
    if turn.turn_index and previous is None:
        raise BufferInputError(f"{where}: turn {turn.turn_index - 1} was never appended")
    if turn.segment_index not in expected:
        raise BufferInputError(f"{where}: segment_index {turn.segment_index}, expected one of {sorted(expected)}")
    starts_segment = previous is None or turn.segment_index != previous.segment_index
    if starts_segment and not turn.prompt_ids:
        raise BufferInputError(f"{where} starts segment {turn.segment_index} but has no prompt_ids")


def split_segments(turns: list[Turn]) -> list[list[Turn]]:
    """Group turns (ordered by turn_index) by segment; segments must be 0, 1, 2, ... in order."""
    segments: list[list[Turn]] = []
    for position, turn in enumerate(turns):
        if turn.turn_index != position:
            raise BufferInputError(f"session {turn.session_id!r}: turn {position} is missing")
        if turn.segment_index == len(segments):
            if not turn.prompt_ids:
                raise BufferInputError(
                    f"session {turn.session_id!r} turn {turn.turn_index} starts segment "
                    f"{turn.segment_index} but has no prompt_ids (the first turn of a segment carries the prompt)"
                )
            segments.append([turn])
        elif segments and turn.segment_index == len(segments) - 1:
            segments[-1].append(turn)
        else:
            raise BufferInputError(
                f"session {turn.session_id!r} turn {turn.turn_index}: segment_index {turn.segment_index} "
                f"after segment {len(segments) - 1} (segments must start at 0 and grow by one)"
            )
    return segments


def build_sample(
    segment: list[Turn], *, status: Sample.Status, index: int, group_index: int, metadata: dict[str, Any]
) -> Sample:
    """One training sample from the turns of one segment (reward is attached by the caller)."""
    first = segment[0]
    tokens = list(first.prompt_ids)
    loss_mask: list[int] = []
    logprobs: list[float] = []
    versions: set[int] = set()
    for position, turn in enumerate(segment):
        if position:  # tokens given to the model between turns (tool results, user messages)
            tokens += turn.prompt_ids
            loss_mask += [0] * len(turn.prompt_ids)
            logprobs += [0.0] * len(turn.prompt_ids)
        tokens += turn.output_ids
        loss_mask += [1] * len(turn.output_ids)
        logprobs += turn.output_logprobs
        versions.update(turn.weight_versions)
    sample = Sample(
        group_index=group_index,
        index=index,
        tokens=tokens,
        response_length=len(tokens) - len(first.prompt_ids),
        loss_mask=loss_mask,
        rollout_log_probs=logprobs,
        weight_versions=sorted(versions),
        status=status,
        metadata=metadata,
        session_id=first.session_id,
        segment_index=first.segment_index,
        split_reason=first.split_reason,
    )
    sample.validate()
    return sample


def build_samples(
    turns: list[Turn], *, status: Sample.Status, index: int, group_index: int, metadata: dict[str, Any]
) -> list[Sample]:
    """All samples of a session; a failed session has none (it is never trained on)."""
    if status is Sample.Status.FAILED:
        return []
    return [
        build_sample(segment, status=status, index=index, group_index=group_index, metadata=metadata)
        for segment in split_segments(turns)
    ]
