"""slime's `rollout_data` dict for the trainer-side hooks that take it, with slime's signatures:

- `--custom-advantage-function-path`: `def custom_fn(args, rollout_data) -> None`, called in place
  of the advantage estimator; it sets `rollout_data["advantages"]` and `["returns"]`, one tensor
  per sample over its response tokens.
- `--rollout-data-postprocess-path`: `def postprocess(args, rollout_id, rollout_data) -> None`,
  called once the advantages are computed, before training; what it changes in place of
  `loss_masks` and `advantages` is what is trained on (slime: "helpful for updating loss mask").

`rollout_data` holds slime's keys for what a batch has here: `tokens`, `rewards` (as trained:
after any reward post-process), `response_lengths`, `loss_masks`, `rollout_log_probs` (None where
a sample has none), `kl` (zeros: the KL is a loss here, not a reward penalty) and `values` (None:
no critic). `args` holds the trainer's and loss's options under their flag names and
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
POSTPROCESS_SIGNATURE = "def postprocess(args, rollout_id: int, rollout_data: dict) -> None  # edits it in place"


def load_advantage_function(path: str) -> Callable[..., Any]:
    return load_function(path, expected=ADVANTAGE_SIGNATURE, params=["args", "rollout_data"], is_async=False)


def load_postprocess(path: str) -> Callable[..., Any]:
    return load_function(path, expected=POSTPROCESS_SIGNATURE, params=["args", "rollout_id", "rollout_data"])


def hook_args(trainer_args: argparse.Namespace, samples: Sequence[Sample]) -> argparse.Namespace:
    group_size = max(Counter(sample_group_ids(samples)).values())
    return argparse.Namespace(**vars(trainer_args), n_samples_per_prompt=group_size)


def rollout_data(samples: Sequence[Sample], rewards: bool = True) -> dict[str, Any]:
    """slime's keys for `samples` (`rewards` only where the samples carry them)."""
    return {
        "tokens": [torch.tensor(s.tokens) for s in samples],
        "rewards": sample_rewards(samples).tolist() if rewards else None,
        "response_lengths": [s.response_length for s in samples],
        "loss_masks": [torch.tensor(s.loss_mask or [1] * s.response_length, dtype=torch.float32) for s in samples],
        "rollout_log_probs": [
            None if s.rollout_log_probs is None else torch.tensor(s.rollout_log_probs) for s in samples
        ],
        "kl": [torch.zeros(s.response_length) for s in samples],
        "values": None,
    }


def custom_advantages(fn: Callable[..., Any], trainer_args: argparse.Namespace, samples: Sequence[Sample]) -> Tensor:
    """[n, R] per-token advantages from `fn` (R: the batch's longest response; padding is 0)."""
    data = rollout_data(samples)
    fn(hook_args(trainer_args, samples), data)
    return per_token(data.get("advantages"), samples, f"the custom advantage function; {ADVANTAGE_SIGNATURE}")


def postprocess(
    fn: Callable[..., Any], trainer_args: argparse.Namespace, rollout_id: int, samples: Sequence[Sample], adv: Tensor
) -> Tensor:
    """Run the postprocess hook on the batch and its advantages; the samples take its loss masks, and
    the advantages it leaves are returned ([n, R])."""
    adv = adv if adv.ndim == 2 else adv.unsqueeze(-1).expand(len(samples), max(s.response_length for s in samples))
    data = rollout_data(samples, rewards=all(isinstance(s.reward, (int, float)) for s in samples))
    data["advantages"] = [adv[i, : s.response_length].clone() for i, s in enumerate(samples)]
    fn(hook_args(trainer_args, samples), rollout_id, data)
    where = f"the rollout data postprocess; {POSTPROCESS_SIGNATURE}"
    masks = per_token(data["loss_masks"], samples, where)
    for sample, mask in zip(samples, masks, strict=True):
        sample.loss_mask = [int(m) for m in mask[: sample.response_length].tolist()]
    return per_token(data["advantages"], samples, where)


def per_token(values: object, samples: Sequence[Sample], where: str) -> Tensor:
    """One tensor per sample over its response tokens -> [n, R], zero-padded; else a ValueError."""
    if not isinstance(values, list) or len(values) != len(samples):
        raise ValueError(f"expected a list of {len(samples)} tensors from {where}")
    out = torch.zeros(len(samples), max(s.response_length for s in samples))
    for i, (value, s) in enumerate(zip(values, samples, strict=True)):
        row = torch.as_tensor(value, dtype=torch.float32).flatten()
        if row.numel() != s.response_length:
            raise ValueError(
                f"sample {i}: {row.numel()} values for its {s.response_length} response tokens from {where}"
            )
        out[i, : s.response_length] = row
    return out
