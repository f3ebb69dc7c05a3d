"""Advantage estimators. Pure torch on small tensors, independent of Megatron."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from slimeish.types import Sample


def group_normalized_advantages(
    rewards: Tensor, group_ids: Sequence[int], *, normalize_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO: A_i = (r_i - mean_g r) / (std_g r + eps), over the samples of i's group g.

    With `normalize_std=False` this is Dr. GRPO's A_i = r_i - mean_g r: dividing by the group's
    std up-weights groups whose rewards barely differ (too easy or too hard prompts) and biases
    the update towards them. std is the unbiased sample std (as in GRPO and slime); a group of
    one sample has advantage 0.
    """
    if rewards.ndim != 1 or rewards.numel() != len(group_ids):
        raise ValueError(f"need one reward per sample: {tuple(rewards.shape)} vs {len(group_ids)} group ids")
    out = torch.zeros_like(rewards, dtype=torch.float32)
    groups = torch.as_tensor(list(group_ids))
    for g in groups.unique():
        idx = (groups == g).nonzero(as_tuple=True)[0]
        r = rewards[idx].float()
        centered = r - r.mean()
        if normalize_std and r.numel() > 1:
            centered = centered / (r.std() + eps)
        out[idx] = centered
    return out


def sample_rewards(samples: Sequence[Sample]) -> Tensor:
    """Scalar rewards of `samples`; a missing or non-numeric reward is a caller error."""
    values = []
    for s in samples:
        if isinstance(s.reward, bool) or not isinstance(s.reward, (int, float)):
            raise ValueError(f"sample {s.session_id or s.index}: reward must be a number, got {s.reward!r}")
        values.append(float(s.reward))
    return torch.tensor(values, dtype=torch.float32)


def sample_group_ids(samples: Sequence[Sample]) -> list[int]:
    if any(s.group_index is None for s in samples):
        raise ValueError("every sample needs a group_index to compute group-normalised advantages")
    return [int(s.group_index) for s in samples]  # type: ignore[arg-type]
