"""slime's `--custom-advantage-function-path`: `def custom_fn(args, rollout_data) -> None`, which
sets `rollout_data["advantages"]` and `rollout_data["returns"]` in place, one tensor per sample
over its response tokens. slime calls it in place of its estimator; so does the trainer here.

`rollout_data` holds slime's keys for what a batch has here: `rewards` (the samples' rewards, as
trained: after any reward post-process), `response_lengths`, `loss_masks`, `rollout_log_probs`
(None where a sample has none), `kl` (zeros: the KL is a loss here, not a reward penalty) and
`values` (None: no critic). `args` holds the trainer's and loss's options under their flag names and
`n_samples_per_prompt` (the batch's group size) for group-wise estimators.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from slimeish.common.plugins import load_function
from slimeish.common.sample import Sample
from slimeish.trainer.advantages import sample_group_ids, sample_rewards

ADVANTAGE_SIGNATURE = (
    "def custom_fn(args, rollout_data: dict) -> None  # sets rollout_data['advantages'] and ['returns']: "
    "one tensor per sample over its response tokens"
)


def load_advantage_function(path: str) -> Callable[..., Any]:
    return load_function(path, expected=ADVANTAGE_SIGNATURE, params=["args", "rollout_data"], is_async=False)


def custom_advantages(fn: Callable[..., Any], trainer_args: argparse.Namespace, samples: Sequence[Sample]) -> Tensor:
    """[n, R] per-token advantages from `fn` (R: the batch's longest response; padding is 0)."""
    group_size = max(Counter(sample_group_ids(samples)).values())
    args = argparse.Namespace(**vars(trainer_args), n_samples_per_prompt=group_size)
    rollout_data: dict[str, Any] = {
        "rewards": sample_rewards(samples).tolist(),
        "response_lengths": [s.response_length for s in samples],
        "loss_masks": [torch.tensor(s.loss_mask or [1] * s.response_length, dtype=torch.float32) for s in samples],
        "rollout_log_probs": [
            None if s.rollout_log_probs is None else torch.tensor(s.rollout_log_probs) for s in samples
        ],
        "kl": [torch.zeros(s.response_length) for s in samples],
        "values": None,
    }
    fn(args, rollout_data)
    advantages = rollout_data.get("advantages")
    if not isinstance(advantages, list) or len(advantages) != len(samples):
        raise ValueError(f"the custom advantage function set no list of {len(samples)} tensors; {ADVANTAGE_SIGNATURE}")
    out = torch.zeros(len(samples), max(s.response_length for s in samples))
    for i, (adv, s) in enumerate(zip(advantages, samples, strict=True)):
        adv = torch.as_tensor(adv, dtype=torch.float32).flatten()
        if adv.numel() != s.response_length:
            raise ValueError(
                f"the custom advantage function gave sample {i} {adv.numel()} advantages for its "
                f"{s.response_length} response tokens; {ADVANTAGE_SIGNATURE}"
            )
        out[i, : s.response_length] = adv
    return out
