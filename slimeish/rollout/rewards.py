"""From what a reward function returns to the number the trainer learns from.

slime lets a reward function return a dict (several scores, or a teacher's raw response) and
picks the trained value later: `--reward-key` names the dict entry, or
`--custom-reward-post-process-path` turns a group's raw rewards into numbers. Here the rule is
applied as soon as it can be, so `Sample.reward` is always a number or None: the raw value stays
in `sample.metadata["raw_reward"]` and its numeric entries in `sample.scores`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from slimeish.common.plugins import load_function
from slimeish.common.sample import RAW_REWARD, Sample

POST_PROCESS_SIGNATURE = (
    "def post_process_rewards(args, samples: list[Sample]) -> tuple[list[float], list[float]]"
    "  # (raw rewards, rewards trained on), one each per sample"
)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def set_reward(args: Any, sample: Sample, value: object, source: str) -> None:
    """Record `value`, returned by `source`, as `sample`'s reward by slime's rules: a number is the
    reward; a dict is resolved by `--reward-key`; anything else waits for the post-process hook."""
    if is_number(value):
        sample.reward = float(value)  # type: ignore[arg-type]  # is_number checked it
        return
    key = getattr(args, "reward_key", None)
    if isinstance(value, dict) and key:
        if key not in value or not is_number(value[key]):
            raise TypeError(f"{source} returned {value!r}: --reward-key {key!r} names no number in it")
        sample.metadata[RAW_REWARD] = value
        sample.scores |= {k: float(v) for k, v in value.items() if is_number(v)}
        sample.reward = float(value[key])
        return
    if getattr(args, "custom_reward_post_process_path", None):
        sample.metadata[RAW_REWARD] = value
        sample.reward = None  # resolved once its group is complete
        return
    raise TypeError(
        f"{source} returned {value!r}; return the reward as a number (-> float), or a dict with "
        "--reward-key naming the entry to train on, or resolve it with --custom-reward-post-process-path"
    )


def load_post_process(path: str) -> Callable[..., Any]:
    return load_function(path, expected=POST_PROCESS_SIGNATURE, params=["args", "samples"], is_async=False)


def post_process_group(args: Any, hook: Callable[..., Any], samples: list[Sample]) -> None:
    """Run slime's reward post-process hook on a complete group (its finished members): the
    second list it returns becomes each sample's reward, the first its `scores["raw_reward"]`."""
    out = hook(args, samples)
    if not (isinstance(out, tuple) and len(out) == 2 and all(len(x) == len(samples) for x in out)):
        raise TypeError(
            f"{args.custom_reward_post_process_path} returned {type(out).__name__} for {len(samples)} samples; "
            f"expected {POST_PROCESS_SIGNATURE}"
        )
    for sample, raw, reward in zip(samples, *out, strict=True):
        value = float(reward) if is_number(reward) or _is_scalar(reward) else None
        if value is None or not math.isfinite(value):
            raise TypeError(f"{args.custom_reward_post_process_path} gave reward {reward!r}; rewards must be numbers")
        sample.reward = value
        if is_number(raw) or _is_scalar(raw):
            sample.scores["raw_reward"] = float(raw)


def _is_scalar(value: object) -> bool:
    """A one-element tensor or array (slime's hooks compute with torch)."""
    return hasattr(value, "item") and getattr(value, "ndim", 1) == 0
