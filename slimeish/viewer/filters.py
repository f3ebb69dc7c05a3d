"""Find samples: the filters of the step page and of a run's sample search, over the rows
`RunReader.groups` returns (one member, its reward and status, and its segments)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ANY_SPLIT = "any"  # split_reason filter: every segment that started with a split
NO_SPLIT = "none"  # ... only first segments


@dataclass(kw_only=True, slots=True)
class SampleFilter:
    min_reward: float | None = None
    max_reward: float | None = None
    status: str | None = None
    split_reason: str | None = None
    min_length: int | None = None
    max_length: int | None = None

    def active(self) -> bool:
        return any(getattr(self, name) is not None for name in self.__slots__)

    def keeps_member(self, member: dict[str, Any]) -> bool:
        reward = member["reward"]
        if (self.min_reward is not None or self.max_reward is not None) and reward is None:
            return False
        if self.min_reward is not None and reward < self.min_reward:
            return False
        if self.max_reward is not None and reward > self.max_reward:
            return False
        return self.status is None or member["status"] == self.status

    def keeps_segment(self, segment: dict[str, Any]) -> bool:
        reason, length = segment["split_reason"], segment["response_length"]
        if self.split_reason == ANY_SPLIT and reason is None:
            return False
        if self.split_reason == NO_SPLIT and reason is not None:
            return False
        if self.split_reason not in (None, ANY_SPLIT, NO_SPLIT) and reason != self.split_reason:
            return False
        if self.min_length is not None and length < self.min_length:
            return False
        return self.max_length is None or length <= self.max_length


def filter_groups(groups: list[dict[str, Any]], keep: SampleFilter) -> list[dict[str, Any]]:
    """The groups with only their members' matching segments; members and groups left with none
    are dropped. A member's advantage stays the one of its whole group."""
    out = []
    for group in groups:
        members = []
        for m in group["members"]:
            segments = [s for s in m["segments"] if keep.keeps_segment(s)] if keep.keeps_member(m) else []
            if segments:
                members.append({**m, "segments": segments})
        if members:
            out.append({**group, "members": members})
    return out
