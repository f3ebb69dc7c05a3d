"""slime's built-in dynamic filters: drop groups whose rewards all agree (DAPO's dynamic sampling),
since every GRPO advantage of such a group is 0 and it carries no gradient."""

from __future__ import annotations

import statistics
from typing import Any

from slimeish.common.sample import Sample
from slimeish.rollout.filter_hub.base_types import DynamicFilterOutput

__all__ = ["check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback"]


def check_reward_nonzero_std(args: Any, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    rewards = [float(s.get_reward_value(args)) for s in samples]
    keep = len(rewards) > 1 and statistics.pstdev(rewards) > 1e-6
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{round(rewards[0], 1)}")


def check_reward_nonzero_std_with_fallback(args: Any, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    """The same, but a zero-variance group still fills a batch that would otherwise be short."""
    out = check_reward_nonzero_std(args, samples, **kwargs)
    out.keep_when_insufficient = True
    return out
