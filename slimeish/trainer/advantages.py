"""Advantage estimators. Pure torch on small tensors, independent of Megatron."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from slimeish.common.sample import Sample


def group_normalized_advantages(
    rewards: Tensor,
    group_ids: Sequence[int],
    *,
    member_ids: Sequence[Hashable] | None = None,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO: A_i = (r_i - mean_g r) / (std_g r + eps), over the members of i's group g.

    With `normalize_std=False` this is Dr. GRPO's A_i = r_i - mean_g r: dividing by the group's
    std up-weights groups whose rewards barely differ (too easy or too hard prompts) and biases
    the update towards them. std is the unbiased sample std (as in GRPO and slime); a group of
    one member has advantage 0.

    `member_ids` names the episode each sample came from: an episode the router split into k
    segments yields k samples with one reward, and counting it k times would bias the baseline,
    so the mean and std are taken over one reward per member, and every segment of a member
    gets its member's advantage. Without `member_ids` every sample is its own member.
    """
    if rewards.ndim != 1 or rewards.numel() != len(group_ids):
        raise ValueError(f"need one reward per sample: {tuple(rewards.shape)} vs {len(group_ids)} group ids")
    members = list(member_ids) if member_ids is not None else list(range(len(group_ids)))
    out = torch.zeros_like(rewards, dtype=torch.float32)
    groups = torch.as_tensor(list(group_ids))
    for g in groups.unique():
        idx = (groups == g).nonzero(as_tuple=True)[0].tolist()
        first = {members[i]: i for i in reversed(idx)}  # one sample (hence one reward) per member
        r = rewards[list(first.values())].float()
        mean, std = r.mean(), r.std() if r.numel() > 1 else None
        for i in idx:
            centered = rewards[i].float() - mean
            out[i] = centered / (std + eps) if normalize_std and std is not None else centered
    return out


def sample_rewards(samples: Sequence[Sample]) -> Tensor:
    """Scalar rewards of `samples`; a missing or non-numeric reward is a caller error."""
    values = []
    for s in samples:
        if isinstance(s.reward, bool) or not isinstance(s.reward, (int, float)):
            raise ValueError(f"sample {s.session_id or s.index}: reward must be a number, got {s.reward!r}")
        values.append(float(s.reward))
    return torch.tensor(values, dtype=torch.float32)


def sample_member_ids(samples: Sequence[Sample]) -> list[Hashable]:
    """The episode of each sample: its router session, else its index in the group."""
    return [s.session_id if s.session_id is not None else ("index", s.index) for s in samples]


def sample_group_ids(samples: Sequence[Sample]) -> list[int]:
    if any(s.group_index is None for s in samples):
        raise ValueError("every sample needs a group_index to compute group-normalised advantages")
    return [int(s.group_index) for s in samples]  # type: ignore[arg-type]
