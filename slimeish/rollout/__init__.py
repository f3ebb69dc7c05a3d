"""The rollout plugin contracts, kept as slime defines them, and their start-up checks.

Three hooks, each named by import path on the command line:

- `--rollout-function-path`: `def generate_rollout(args, rollout_id, data_source, evaluation=False)`
  returning `RolloutFnTrainOutput` (or `RolloutFnEvalOutput` when `evaluation` is true);
- `--custom-generate-function-path`: `async def generate(args, sample, sampling_params) -> Sample`
  (or a `list[Sample]`: the samples of one group member);
- `--custom-rm-path`: `async def reward(args, sample) -> float`.

`args` is a read-only namespace with slime's attribute names (`rollout_batch_size`,
`n_samples_per_prompt`, `rollout_max_response_len`, `rollout_temperature`, `hf_checkpoint`,
`sglang_router_ip`, `sglang_router_port`, ...) plus slimeish's `router_url` and `admin_token`.

A rollout function's module may declare flags of its own: `ROLLOUT_CONFIG` names a
`@dataclass(kw_only=True)` whose fields use `help_field`. `slimeish train` then shows them under
the module's name, builds the dataclass, calls its `check()` method (if it has one) before any
process starts, and puts every field on `args` under its own name.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from slimeish.common.config import help_field
from slimeish.common.plugins import load_function
from slimeish.common.sample import Sample
from slimeish.rollout.base_types import RolloutFnEvalOutput as RolloutFnEvalOutput  # slime's path; also here
from slimeish.rollout.base_types import RolloutFnTrainOutput as RolloutFnTrainOutput
from slimeish.rollout.dynamic_filter import DYNAMIC_FILTER_SIGNATURE
from slimeish.rollout.rewards import POST_PROCESS_SIGNATURE

ROLLOUT_SIGNATURE = (
    "def generate_rollout(args, rollout_id: int, data_source, evaluation: bool = False)"
    " -> RolloutFnTrainOutput | list[list[Sample]] | RolloutFnEvalOutput | dict"
)
GENERATE_SIGNATURE = "async def generate(args, sample: Sample, sampling_params: dict) -> Sample | list[Sample]"
REWARD_SIGNATURE = "async def reward(args, sample: Sample) -> float  # or a dict, with --reward-key"


@dataclass(kw_only=True)
class RolloutConfig:
    rollout_function_path: str = help_field(
        "slimeish.rollout_functions.token_in.generate_rollout", help=f"rollout function: {ROLLOUT_SIGNATURE}"
    )
    custom_generate_function_path: str | None = help_field(
        None, help=f"per-sample generate used by token_in (default: token-in through the router): {GENERATE_SIGNATURE}"
    )
    custom_rm_path: str | None = help_field(None, help=f"reward function: {REWARD_SIGNATURE}")
    reward_key: str | None = help_field(
        None, help="when the reward function returns a dict: the entry trained on (the dict stays in sample.scores)"
    )
    custom_reward_post_process_path: str | None = help_field(
        None, help=f"turns a complete group's raw rewards into the rewards trained on: {POST_PROCESS_SIGNATURE}"
    )
    dynamic_sampling_filter_path: str | None = help_field(
        None,
        help=f"slime's group filter, applied to each complete group before it is trained: {DYNAMIC_FILTER_SIGNATURE} "
        "(e.g. slimeish.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std)",
    )
    rollout_sample_hook_path: list[str] = help_field(
        [],
        help="slime's hooks on each generated sample before its reward (token_in), in order: def hook(args, sample, *, "
        "rollout_id=None, evaluation=False) -> Sample | None, plain or async (slimeish.rollout.sample_hooks)",
    )
    rollout_batch_size: int = help_field(8, help="prompts per rollout step")
    n_samples_per_prompt: int = help_field(4, help="samples per prompt (the GRPO group size)")
    rollout_max_response_len: int = help_field(64, help="max new tokens per turn")
    rollout_temperature: float = help_field(1.0, help="sampling temperature")
    rollout_top_p: float = help_field(1.0, help="nucleus sampling threshold")
    rollout_top_k: int = help_field(-1, help="top-k sampling (-1: off)")
    rollout_stop: list[str] = help_field([], help="stop strings")
    rollout_concurrency: int = help_field(64, help="episodes in flight at once")
    rollout_timeout: float = help_field(300.0, help="seconds before an episode is failed")
    router_retry_s: float = help_field(
        120.0,
        help="seconds a session call is retried while the router restarts or answers 503 (buffer or engines down)",
    )
    n_samples_per_eval_prompt: int = help_field(1, help="samples per eval prompt")
    eval_temperature: float = help_field(0.0, help="sampling temperature for evaluation (0: greedy)")
    eval_top_p: float | None = help_field(None, help="nucleus threshold for evaluation (default: --rollout-top-p)")
    eval_top_k: int | None = help_field(None, help="top-k for evaluation (default: --rollout-top-k)")
    eval_max_response_len: int | None = help_field(
        None, help="max new tokens per evaluation turn (default: --rollout-max-response-len)"
    )


def load_rollout_function(path: str) -> Callable[..., Any]:
    return load_function(path, expected=ROLLOUT_SIGNATURE, params=["args", "rollout_id", "data_source"], is_async=False)


def generated_samples(out: object, source: str) -> list[Sample]:
    """What a generate function returned, as the samples of one group member: one `Sample`, or as
    slime also allows a non-empty `list[Sample]`. Anything else is an error naming the signature."""
    if isinstance(out, Sample):
        return [out]
    if isinstance(out, list) and out and all(isinstance(s, Sample) for s in out):
        return out
    raise TypeError(f"{source} returned {type(out).__name__}; expected {GENERATE_SIGNATURE}")


def load_generate_function(path: str) -> Callable[..., Awaitable[Sample | list[Sample]]]:
    return load_function(path, expected=GENERATE_SIGNATURE, params=["args", "sample", "sampling_params"], is_async=True)


def load_reward_function(path: str) -> Callable[..., Awaitable[float]]:
    return load_function(path, expected=REWARD_SIGNATURE, params=["args", "sample"], is_async=True)


# The module attribute naming a rollout function's own config dataclass.
ROLLOUT_CONFIG = "ROLLOUT_CONFIG"


@runtime_checkable
class CheckedConfig(Protocol):
    """A rollout function's config that checks itself at start-up (raise ValueError, saying what
    was expected): e.g. that a function it names imports and has the right signature."""

    def check(self) -> None: ...


def rollout_config_type(path: str) -> type[Any] | None:
    """The config dataclass the module of rollout function `path` declares, or None."""
    load_rollout_function(path)  # imports the module, and fails with the expected signature
    module = importlib.import_module(path.replace(":", ".").rpartition(".")[0])
    cls = getattr(module, ROLLOUT_CONFIG, None)
    if cls is not None and not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"{module.__name__}.{ROLLOUT_CONFIG} must name a @dataclass(kw_only=True), got {cls!r}")
    return cls


def check_rollout_config(cfg: object) -> None:
    """Run a rollout function's start-up check of its config, where it defines one."""
    if isinstance(cfg, CheckedConfig):
        cfg.check()


# A training session that captured no turn while its sample came back with tokens of its own (a slime
# plugin that posted to the router's root /generate) is left open, with the URL of the router that
# holds it under this metadata key: slimeish train appends the returned tokens to it as turns, then
# finishes it on that router, so the sample is recorded from what the plugin returned, at its own
# place in its group.
RECORD_FROM_RETURN = "record_from_return"


def carries_response(sample: Sample) -> bool:
    """The sample holds sampled tokens of its own to train on (slime's fields, response part)."""
    return sample.response_length > 0 and sample.rollout_log_probs is not None


def training_group_id(sample: Sample) -> str:
    """The buffer group of a training sample: one per prompt draw (`group_index`), so regenerated
    members of a reopened group (served with the same `group_index`) land in it again. For a sample
    the data source gave; one read back from the buffer names its group in `metadata["group_id"]`
    (its `group_index` is the buffer's own sequence number of the group, docs/buffer.md)."""
    if sample.group_index is None:
        raise ValueError("a training sample needs the group_index its data source gave it (get_samples sets it)")
    return f"g{sample.group_index}"


def session_metadata(sample: Sample, evaluation: bool) -> dict[str, Any]:
    """What a session stores about its episode. A group keeps its first session's, and a
    regeneration request brings it back to the data source, so it holds all a prompt draw needs."""
    return {
        "prompt": sample.prompt,
        "label": sample.label,
        "group_index": sample.group_index,
        "eval": evaluation,
        **sample.metadata,
    }


def sampling_params(cfg: RolloutConfig, *, evaluation: bool = False) -> dict[str, Any]:
    """SGLang `sampling_params` for one rollout turn."""
    params: dict[str, Any] = {
        "max_new_tokens": cfg.rollout_max_response_len,
        "temperature": cfg.rollout_temperature,
        "top_p": cfg.rollout_top_p,
        "top_k": cfg.rollout_top_k,
    }
    if evaluation:  # slime's eval overrides; each unset one keeps the rollout's
        overrides = {
            "max_new_tokens": getattr(cfg, "eval_max_response_len", None),
            "temperature": cfg.eval_temperature,
            "top_p": getattr(cfg, "eval_top_p", None),
            "top_k": getattr(cfg, "eval_top_k", None),
        }
        params |= {k: v for k, v in overrides.items() if v is not None}
    if cfg.rollout_stop:
        params["stop"] = list(cfg.rollout_stop)
    return params
