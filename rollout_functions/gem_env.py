"""GEM (`gem-llm`) environments, played by the text-game driver (`text_games`): any env of GEM's
registry (`game:GuessTheNumber-v0-easy`, `game:Wordle-v0-easy`, `rg:leg_counting`, ...), with
GEM's own `reset() -> (obs, info)` / `step(action) -> (obs, reward, terminated, truncated, info)`.

    python -m slimeish.rollout_functions.gem_env DATA --env-id game:GuessTheNumber-v0-easy
    slimeish train --rollout-function-path slimeish.rollout_functions.gem_env \\
        --env-id game:GuessTheNumber-v0-easy --prompt-data DATA/train.jsonl ...

Every member plays its own episode (`gem.make(env_id, **env_args)`, `reset(seed=label.seed)`): the
observation is a user message, each model turn the action, until terminated or truncated. The
reward is the return, the sum of GEM's step rewards (its games reward the end and penalize invalid
moves).

GEM is not a pip extra: `gem-llm` 0.1.0 pins msgspec 0.19.0 and reasoning-gym 0.1.23 (slimeish pins
msgspec 0.22.0 and reasoning-gym 0.1.25), so pip cannot resolve it with slimeish. Its code runs with
slimeish's versions (tests/environments), so it is installed as the Makefile installs SGLang's
wheel: `pip install --no-deps gem-llm==0.1.0` over slimeish's `textarena` and `reasoning-gym`
extras, which bring what else GEM imports (nltk, reasoning-gym; math-verify is slimeish's own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slimeish.common.sample import Sample
from slimeish.rollout import RolloutFnEvalOutput, RolloutFnTrainOutput
from slimeish.rollout_functions.environments import EnvConfig, EpisodeContext, prompts_main, run_env
from slimeish.rollout_functions.text_games import GymGame, TextGame, TextGameAdapter


@dataclass(kw_only=True)
class GemConfig(EnvConfig):
    package = "gem"
    extra = "gem"

    @classmethod
    def install(cls) -> str:
        return "pip install 'slimeish[textarena,reasoning-gym]' && pip install --no-deps gem-llm==0.1.0"


ROLLOUT_CONFIG = GemConfig


class Gem(TextGameAdapter):
    def __init__(self, env_id: str, env_args: dict[str, Any]) -> None:
        super().__init__(env_id, env_args)
        self.gem = GemConfig.load()

    def records(self, n: int, seed: int, split: str) -> list[dict[str, Any]]:
        return self.seed_records(n, seed, split)

    def open(self, sample: Sample, ctx: EpisodeContext) -> TextGame:
        return GymGame(self.gem.make(self.env_id, **self.env_args), int(sample.label["seed"]))


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    return run_env(Gem, args, rollout_id, data_source, evaluation)


if __name__ == "__main__":
    prompts_main(Gem)
