"""slime's Megatron-side hooks, with slime's signatures, called where slime's trainer calls them:

- `--custom-megatron-init-path`: `def init(args) -> None`, once the process group is up, before the
  model is built;
- `--custom-megatron-before-log-prob-hook-path`: `def hook(args, model, store_prefix) -> None`,
  before each forward-only log-prob pass (`store_prefix` is "" for the policy, as slime's actor);
- `--custom-megatron-before-train-step-hook-path`:
  `def hook(args, rollout_id, step_id, model, optimizer, opt_param_scheduler) -> None`, after the
  gradients are zeroed, before each optimizer step's micro-batches. There is no scheduler object
  here (the learning rate is set per step from the config), so `opt_param_scheduler` is None.

`args` holds the trainer's and the loss's options under their flag names.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slimeish.common.plugins import load_function

INIT_SIGNATURE = "def init(args) -> None"
BEFORE_LOG_PROB_SIGNATURE = "def hook(args, model, store_prefix: str) -> None"
BEFORE_TRAIN_STEP_SIGNATURE = "def hook(args, rollout_id, step_id, model, optimizer, opt_param_scheduler) -> None"


@dataclass
class MegatronHooks:
    init: Callable[..., Any] | None = None
    before_log_prob: Callable[..., Any] | None = None
    before_train_step: Callable[..., Any] | None = None

    @classmethod
    def load(cls, init: str | None, before_log_prob: str | None, before_train_step: str | None) -> MegatronHooks:
        """Import each given hook and check its signature (errors state the expected one)."""

        def load(path: str | None, expected: str, params: list[str]) -> Callable[..., Any] | None:
            return load_function(path, expected=expected, params=params, is_async=False) if path else None

        return cls(
            init=load(init, INIT_SIGNATURE, ["args"]),
            before_log_prob=load(before_log_prob, BEFORE_LOG_PROB_SIGNATURE, ["args", "model", "store_prefix"]),
            before_train_step=load(
                before_train_step,
                BEFORE_TRAIN_STEP_SIGNATURE,
                ["args", "rollout_id", "step_id", "model", "optimizer", "opt_param_scheduler"],
            ),
        )


def trainer_args(*configs: Any) -> argparse.Namespace:
    """The `args` trainer hooks receive: every option of `configs` under its flag name."""
    return argparse.Namespace(**{k: v for cfg in configs for k, v in dataclasses.asdict(cfg).items()})
