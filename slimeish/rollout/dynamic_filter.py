"""`--dynamic-sampling-filter-path`: slime's group filter, loaded and checked before any process
starts, and applied when the trainer takes a complete group from the buffer.

slime's filter returns a `DynamicFilterOutput`; an object of any other type (a bare bool
included) is an error, never taken as true. Dropped groups are counted per reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from slimeish.common.plugins import load_function
from slimeish.common.sample import Sample
from slimeish.rollout.filter_hub.base_types import DynamicFilterOutput

DYNAMIC_FILTER_SIGNATURE = "def dynamic_filter(args, samples: list[Sample], **kwargs) -> DynamicFilterOutput"


class DynamicFilter:
    """A slime dynamic filter as the buffer's group filter (`keep(group_id, samples) -> bool`)."""

    def __init__(self, path: str, args: Any):
        self.path = path
        self.args = args
        self.fn: Callable[..., Any] = load_function(
            path, expected=DYNAMIC_FILTER_SIGNATURE, params=["args", "samples"], is_async=False
        )
        self.dropped: Counter[str] = Counter()

    def judge(self, samples: list[Sample]) -> DynamicFilterOutput:
        out = self.fn(self.args, samples)
        if not isinstance(out, DynamicFilterOutput):
            raise TypeError(
                f"the dynamic filter {self.path} returned {type(out).__name__} ({out!r}); expected "
                f"{DYNAMIC_FILTER_SIGNATURE} (from slimeish.rollout.filter_hub.base_types)"
            )
        return out

    def __call__(self, group_id: str, samples: list[Sample]) -> bool:
        out = self.judge(samples)
        if bool(out.keep) or out.keep_when_insufficient:  # sync mode never over-samples: a drop leaves it short
            return True
        self.dropped[out.reason or "unspecified"] += 1
        return False

    def check(self, group_size: int) -> None:
        """Start-up check of the return type, on a probe group with differing rewards."""
        self.judge([Sample(index=i, reward=float(i % 2), response_length=0) for i in range(max(group_size, 2))])

    def metrics(self) -> dict[str, float]:
        """Groups dropped since the last call, by reason (slime's metric names)."""
        out = {f"rollout/dynamic_filter/drop_{reason}": float(n) for reason, n in self.dropped.items()}
        self.dropped.clear()
        return out
