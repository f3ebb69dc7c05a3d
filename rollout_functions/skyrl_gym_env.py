"""SkyRL-Gym text environments (`skyrl_gym.make`), stepped by the model's turns.

    slimeish train --rollout-function-path slimeish.rollout_functions.skyrl_gym_env \\
        --env-id gsm8k_multi_turn --prompt-data DATA.jsonl ...

SkyRL-Gym environments take their tasks from the user's dataset, as in SkyRL: each JSONL record
is `prompt` (chat messages) and `label`, the environment's `extras` (`reward_spec.ground_truth`,
`extra_info`, ...); `--env-args` is its `env_config`. An episode is the environment's own loop:
`init(prompt)` gives the first messages, then each model turn through the member's session is an
`action`, `step(action)` answers with observation messages (user or tool), until `done`, played by
the text-game driver (`text_games`). The reward is the episode's return, the sum of the step rewards
(SkyRL-Gym rewards turns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slimeish.common.sample import Sample
from slimeish.rollout import RolloutFnEvalOutput, RolloutFnTrainOutput
from slimeish.rollout_functions.environments import EnvConfig, EpisodeContext, run_env
from slimeish.rollout_functions.text_games import Step, TextGame, TextGameAdapter, Turn


@dataclass(kw_only=True)
class SkyRLGymConfig(EnvConfig):
    package = "skyrl_gym"
    extra = "skyrl-gym"


ROLLOUT_CONFIG = SkyRLGymConfig


class SkyRLGymGame(TextGame):
    """A SkyRL-Gym env: `init(prompt)` gives the first messages, `step(action)` a dict of
    `observations` (messages), `reward` and `done`; its numeric metrics are scored at the end."""

    def __init__(self, env: Any, prompt: Any) -> None:
        self.env, self.prompt = env, prompt

    def reset(self) -> Turn:
        first, _ = self.env.init(self.prompt)
        return Turn(0, list(first))

    def step(self, action: str) -> Step:
        out = self.env.step(action)
        if not out["done"]:
            return Step({0: float(out["reward"])}, Turn(0, list(out["observations"])))
        metrics = {k: float(v) for k, v in self.env.get_metrics().items() if isinstance(v, (int, float))}
        return Step({0: float(out["reward"])}, None, metrics)

    def close(self) -> None:
        self.env.close()


class SkyRLGym(TextGameAdapter):
    def __init__(self, env_id: str, env_args: dict[str, Any]) -> None:
        super().__init__(env_id, env_args)
        self.gym = SkyRLGymConfig.load()

    def records(self, n: int, seed: int, split: str) -> list[dict[str, Any]]:
        raise ValueError(
            "SkyRL-Gym environments have no task generator: write a JSONL of `prompt` (chat messages) "
            'and `label` (the environment\'s extras, e.g. {"reward_spec": {"ground_truth": ...}})'
        )

    def open(self, sample: Sample, ctx: EpisodeContext) -> TextGame:
        return SkyRLGymGame(self.gym.make(self.env_id, env_config=self.env_args, extras=sample.label), sample.prompt)


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    return run_env(SkyRLGym, args, rollout_id, data_source, evaluation)
