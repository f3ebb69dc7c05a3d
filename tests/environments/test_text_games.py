"""Gymnasium-style text environments through `slimeish train`: a TextArena game in self-play (each
player a group member with its own reward) and a multi-turn SkyRL-Gym environment."""

from __future__ import annotations

import json

import pytest

from slimeish.rollout_functions.textarena_env import TextArena
from tests.environments.conftest import check_run, run_train

pytestmark = pytest.mark.slow


def write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_textarena_self_play_trains_three_steps_with_exact_capture(tiny_model, stack, tmp_path):
    game = "SimpleNegotiation-v0"  # free-text moves: both players act whatever the untrained model says
    prompts = write(tmp_path / "train.jsonl", TextArena(game, {}).records(8, 0, "train"))
    run_dir = tmp_path / "ta-negotiation"
    run_train(
        stack, tiny_model, run_dir, "slimeish.rollout_functions.textarena_env.generate_rollout",
        "--env-id", game, "--prompt-data", prompts, "--rollout-concurrency", "4",
    )  # fmt: skip
    samples = check_run(stack, run_dir)
    # every player took several turns, each after the game's observation: one segment per player
    assert all(s.loss_mask.count(0) > 0 for s in samples)
    assert all(s.reward in (-1.0, 0.0, 1.0) for s in samples)  # TextArena's win / draw / loss


def test_skyrl_gym_multi_turn_trains_three_steps_with_exact_capture(tiny_model, stack, tmp_path):
    records = [
        {"prompt": [{"role": "user", "content": f"What is {a} + {b}? End with '#### ANSWER'."}],
         "label": {"reward_spec": {"ground_truth": str(a + b)}, "max_turns": 2, "extra_info": {}}}
        for a in range(4) for b in (2, 5)
    ]  # fmt: skip
    run_dir = tmp_path / "skyrl-gsm8k"
    run_train(
        stack, tiny_model, run_dir, "slimeish.rollout_functions.skyrl_gym_env.generate_rollout",
        "--env-id", "gsm8k_multi_turn", "--prompt-data", write(tmp_path / "train.jsonl", records),
    )  # fmt: skip
    samples = check_run(stack, run_dir)
    assert all(s.loss_mask.count(0) > 0 for s in samples if s.reward < 1.0)  # two turns unless solved at once
