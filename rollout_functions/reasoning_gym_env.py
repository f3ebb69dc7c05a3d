"""reasoning-gym tasks as single-turn episodes, scored by reasoning-gym's own `score_answer`.

    python -m slimeish.rollout_functions.reasoning_gym_env DATA --env-id leg_counting
    slimeish train --rollout-function-path slimeish.rollout_functions.reasoning_gym_env \\
        --env-id leg_counting --prompt-data DATA/train.jsonl --eval-prompt-data DATA/eval.jsonl ...

The prompts are the task's generated questions under reasoning-gym's default system prompt (answer
in <answer> tags); each record's label is the generator's entry. An episode is one chat turn
through the member's session; the answer is what `reasoning_gym.utils.extract_answer` finds, and
the reward is the task's `score_answer(answer, entry)` (0 to 1, partial credit where the task gives it).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from slimeish.common.sample import Sample
from slimeish.rollout import RolloutFnEvalOutput, RolloutFnTrainOutput
from slimeish.rollout_functions.environments import (
    Conversation,
    EnvAdapter,
    EnvConfig,
    EpisodeContext,
    Outcome,
    prompts_main,
    run_env,
)
from slimeish.rollout_functions.sessions import Session

# a held-out split draws from another seed range, so no generated question is in both
EVAL_SEED_OFFSET = 1_000_003


@dataclass(kw_only=True)
class ReasoningGymConfig(EnvConfig):
    package = "reasoning_gym"
    extra = "reasoning-gym"


ROLLOUT_CONFIG = ReasoningGymConfig


class ReasoningGym(EnvAdapter):
    def __init__(self, env_id: str, env_args: dict[str, Any]) -> None:
        super().__init__(env_id, env_args)
        self.rg = ReasoningGymConfig.load()
        self.utils = ReasoningGymConfig.load("reasoning_gym.utils")

    @functools.cached_property
    def scorer(self) -> Any:
        """A dataset of the task, for its `score_answer` (which reads only the entry it is given)."""
        return self.rg.create_dataset(self.env_id, size=1, seed=0, **self.env_args)

    def records(self, n: int, seed: int, split: str) -> list[dict[str, Any]]:
        seed = seed + (EVAL_SEED_OFFSET if split == "eval" else 0)
        dataset = self.rg.create_dataset(self.env_id, size=n, seed=seed, **self.env_args)
        system = self.utils.SYSTEM_PROMPTS["default"]
        return [
            # the label as the JSONL file gives it back (tuples in an entry's metadata become lists)
            {"prompt": [{"role": "system", "content": system}, {"role": "user", "content": e["question"]}],
             "label": json.loads(json.dumps(e))}
            for e in dataset
        ]  # fmt: skip

    async def run(self, session: Session, sample: Sample, ctx: EpisodeContext) -> Outcome:
        prompt = sample.prompt if isinstance(sample.prompt, list) else [{"role": "user", "content": sample.prompt}]
        text = await Conversation(self.client(session), prompt).act()
        answer = self.utils.extract_answer(text)
        score = float(self.scorer.score_answer(answer=answer, entry=sample.label))
        sample.response = text
        return Outcome(score, {"score": score, "answered": float(answer is not None)})


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    return run_env(ReasoningGym, args, rollout_id, data_source, evaluation)


if __name__ == "__main__":
    prompts_main(ReasoningGym)
