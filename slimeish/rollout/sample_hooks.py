"""slime's `--rollout-sample-hook-path` (repeatable): each generated sample goes through the hooks, in
order, before its reward is computed. A hook is `hook(args, sample, *, rollout_id=None,
evaluation=False) -> Sample | None`, plain or async; a returned Sample replaces the one given,
None keeps it (edited in place or not). Called by `slimeish.rollout_functions.token_in`, where
slime's default rollout calls them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from slimeish.common.plugins import load_function
from slimeish.common.sample import Sample

SAMPLE_HOOK_SIGNATURE = "def hook(args, sample, *, rollout_id=None, evaluation=False) -> Sample | None  # or async"


def load_sample_hooks(paths: Sequence[str]) -> list[Callable[..., Any]]:
    """Import each hook and check it takes slime's arguments (rollout_id and evaluation by keyword)."""
    hooks = []
    for path in paths:
        hook = load_function(path, expected=SAMPLE_HOOK_SIGNATURE, params=["args", "sample"])
        try:
            inspect.signature(hook).bind(None, None, rollout_id=0, evaluation=False)
        except TypeError as exc:
            raise ValueError(
                f"plugin {path!r} has the wrong signature ({exc}); expected {SAMPLE_HOOK_SIGNATURE}"
            ) from exc
        hooks.append(hook)
    return hooks


async def apply_sample_hooks(
    hooks: Sequence[Callable[..., Any]], args: Any, sample: Sample, *, rollout_id: int, evaluation: bool
) -> Sample:
    for hook in hooks:
        result = hook(args, sample, rollout_id=rollout_id, evaluation=evaluation)
        if inspect.isawaitable(result):
            result = await result
        if result is not None and not isinstance(result, Sample):
            raise TypeError(f"the rollout sample hook {hook.__qualname__} returned {type(result).__name__}; "
                            f"expected {SAMPLE_HOOK_SIGNATURE}")  # fmt: skip
        sample = result if result is not None else sample
    return sample
