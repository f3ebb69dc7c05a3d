"""reasoning-gym tasks through `slimeish train`, scored by the tasks' own `score_answer`."""

from __future__ import annotations

import json

import pytest

from slimeish.rollout_functions.reasoning_gym_env import ReasoningGym
from tests.environments.conftest import check_run, run_train

pytestmark = pytest.mark.slow
ADAPTER = "slimeish.rollout_functions.reasoning_gym_env.generate_rollout"


def test_prompts_carry_the_generator_entry_and_splits_differ(tmp_path):
    adapter = ReasoningGym("basic_arithmetic", {})
    train, eval_ = adapter.records(4, 0, "train"), adapter.records(4, 0, "eval")
    assert {r["prompt"][-1]["content"] for r in train}.isdisjoint(r["prompt"][-1]["content"] for r in eval_)
    entry = train[0]["label"]
    assert json.loads(json.dumps(entry)) == entry  # survives the JSONL file
    assert adapter.scorer.score_answer(answer=entry["answer"], entry=entry) == 1.0


@pytest.mark.parametrize("task", ["leg_counting", "basic_arithmetic", "spell_backward", "chain_sum", "letter_counting"])
def test_task_trains_three_steps_with_exact_capture(task, tiny_model, stack, tmp_path):
    data = tmp_path / "data"
    adapter = ReasoningGym(task, {})
    for split, n in (("train", 8), ("eval", 2)):
        data.mkdir(exist_ok=True)
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in adapter.records(n, 0, split)))
    run_dir = tmp_path / f"rg-{task}"
    run_train(stack, tiny_model, run_dir, ADAPTER, "--env-id", task, "--prompt-data", str(data / "train.jsonl"))
    samples = check_run(stack, run_dir, scores={"score", "answered"})
    assert all(0.0 <= s.reward <= 1.0 for s in samples)  # score_answer's range
