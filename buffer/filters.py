"""Built-in group filters for `--group-filter-path` (signature in buffer/config.py)."""

from __future__ import annotations

from slimeish.common.sample import Sample


def nonzero_reward_variance(group_id: str, samples: list[Sample]) -> bool:
    """Keep a group only if its rewards differ: with all-equal rewards every GRPO advantage is 0,
    so the group carries no gradient (DAPO's dynamic sampling drops such groups)."""
    rewards = [_scalar(s.reward) for s in samples]
    return len(set(rewards)) > 1


def _scalar(reward: float | dict | None) -> float:
    if not isinstance(reward, (int, float)):
        raise ValueError(f"nonzero_reward_variance needs scalar rewards, got {reward!r}")
    return float(reward)
