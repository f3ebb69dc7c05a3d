"""What a rollout function returns (`--rollout-function-path`), under slime's module path:
`from slime.rollout.base_types import RolloutFnTrainOutput` ports as
`from slimeish.rollout.base_types import RolloutFnTrainOutput`.

slime's `call_rollout_fn` is not here: it is how slime's rollout manager calls the rollout
function, not something a plugin calls, and slimeish's caller is stricter (a bare list of groups
is taken for training and a bare dict of datasets for evaluation; anything else is an error
naming the signature, never wrapped).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slimeish.common.sample import Sample


@dataclass
class RolloutFnTrainOutput:
    """What a rollout function returns for training: groups of finished samples, and metrics."""

    samples: list[list[Sample]]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class RolloutFnEvalOutput:
    """What a rollout function returns for evaluation: per-dataset `{"rewards": [...], ...}`."""

    data: dict[str, dict[str, list[Any]]]
    metrics: dict[str, float] = field(default_factory=dict)
