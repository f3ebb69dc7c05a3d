"""`Sample`: the one record that flows from rollout to buffer to trainer.

Field names and meanings follow slime's `Sample`, so slime rollout plugins port unchanged:
`tokens` is prompt + response; `response_length` counts the response part; `loss_mask` and
`rollout_log_probs` cover the response part only (length `response_length`), with mask 1 on
tokens the model sampled and 0 on tokens it was given (tool results, user turns inside a
multi-turn segment), and log-prob 0.0 wherever the mask is 0.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


@dataclass
class Sample:
    class Status(StrEnum):
        """How an episode stands: the one vocabulary of the rollout side, the router and the
        buffer (where a session still PENDING is open). Nested, as slime spells it."""

        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"  # stopped by max_new_tokens / context length
        ABORTED = "aborted"  # stopped by the system (timeout, abort request)
        FAILED = "failed"  # the agent or the reward function failed

    group_index: int | None = None  # which prompt this answers (the GRPO group)
    index: int | None = None  # position inside the group
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | None = None  # what the trainer learns from
    scores: dict[str, float] = field(default_factory=dict)  # named scores beside it (sub-checks), not trained on
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    weight_versions: list[int] = field(default_factory=list)
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    # slimeish additions: where the sample came from in the router's capture.
    session_id: str | None = None
    segment_index: int = 0
    split_reason: str | None = None  # why this segment started a new sample (None for the first)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    def validate(self) -> None:
        """Raise ValueError if the token, mask and log-prob arrays disagree."""
        if not 0 <= self.response_length <= len(self.tokens):
            raise ValueError(f"response_length={self.response_length} but len(tokens)={len(self.tokens)}")
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(f"len(loss_mask)={len(self.loss_mask)} != response_length={self.response_length}")
        if self.loss_mask is not None and any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask must contain only 0 and 1")
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"len(rollout_log_probs)={len(self.rollout_log_probs)} != response_length={self.response_length}"
            )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        d = dict(d)
        d["status"] = cls.Status(d.get("status", "pending"))
        return cls(**d)


Status = Sample.Status
