"""Built-in group filters for `--group-filter-path` (signature in buffer/config.py)."""

from __future__ import annotations

from slimeish.common.sample import Sample


def nonzero_reward_variance(group_id: str, samples: list[Sample]) -> bool:
    """Keep a group only if its rewards differ: with all-equal rewards every GRPO advantage is 0,
    so the group carries no gradient (DAPO's dynamic sampling drops such groups)."""
    rewards = [s.reward for s in samples]
    if None in rewards:
        raise ValueError("nonzero_reward_variance needs scalar rewards, got a sample without one")
    return len(set(rewards)) > 1
