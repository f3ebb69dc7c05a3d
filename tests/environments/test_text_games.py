"""Gymnasium-style text environments through `slimeish train`, all played by one driver
(`text_games`): a TextArena game in self-play (each player a group member with its own reward) and
against a fixed opponent (only the policy's player a member), a multi-turn SkyRL-Gym environment,
and a GEM game."""

from __future__ import annotations

import json
import re
import sys

import pytest

from slimeish.rollout_functions.gem_env import Gem, GemConfig
from slimeish.rollout_functions.textarena_env import TextArena, TextArenaConfig
from tests.environments.conftest import check_run, finish_scores, run_train

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


def test_textarena_against_a_random_opponent_trains_only_the_policys_player(tiny_model, stack, tmp_path):
    game = "TicTacToe-v0"  # the game lists its legal moves: the random opponent picks among them
    prompts = write(tmp_path / "train.jsonl", TextArena(game, {}).records(8, 0, "train"))
    run_dir = tmp_path / "ta-tictactoe-random"
    run_train(
        stack, tiny_model, run_dir, "slimeish.rollout_functions.textarena_env.generate_rollout",
        "--env-id", game, "--prompt-data", prompts, "--opponent", "random", "--policy-player", "1",
    )  # fmt: skip
    samples = check_run(stack, run_dir, scores={"turns", "opponent_moves"})
    assert all(s.reward in (-1.0, 0.0, 1.0) for s in samples)
    # each member played player 1 of its own game (its own session, reward and episode): the random
    # opponent, player 0, moved first, and its moves reached the policy only in the observations
    named = finish_scores(stack.buffer_url, run_dir.name, [s.session_id for s in samples])
    assert all(scores["opponent_moves"] >= 1 for scores in named)
    assert len({s.session_id for s in samples}) == len(samples)


def test_gem_game_trains_three_steps_with_exact_capture(tiny_model, stack, tmp_path):
    game = "game:GuessTheNumber-v0-easy"
    prompts = write(tmp_path / "train.jsonl", Gem(game, {}).records(8, 0, "train"))
    run_dir = tmp_path / "gem-guess"
    run_train(
        stack, tiny_model, run_dir, "slimeish.rollout_functions.gem_env.generate_rollout",
        "--env-id", game, "--prompt-data", prompts,
    )  # fmt: skip
    samples = check_run(stack, run_dir, scores={"turns", "last_step_reward"})
    named = finish_scores(stack.buffer_url, run_dir.name, [s.session_id for s in samples])
    for sample, scores in zip(samples, named, strict=True):
        assert scores["turns"] >= 1
        # the return: GEM's step rewards summed, the last one among them (no invalid guess costs more than -0.1)
        assert sample.reward <= 1.0 and sample.reward >= -0.1 * scores["turns"]


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


def test_gem_missing_names_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "gem", None)  # as if not installed: importing it raises
    with pytest.raises(ValueError, match=r"pip install --no-deps gem-llm==0\.1\.0"):
        GemConfig(env_id="game:GuessTheNumber-v0-easy").check()


@pytest.mark.parametrize(
    ("opponent", "policy_player", "says"),
    [
        ("scripted", 0, "must be `random` or `module:function`"),
        ("no_such_module:act", 0, "ModuleNotFoundError"),
        ("json:no_such_function", 0, "AttributeError"),
        ("random", 2, "--policy-player 2 is no player of a 2-player game"),
    ],
)
def test_a_bad_opponent_stops_at_start_up(opponent, policy_player, says):
    config = TextArenaConfig(env_id="TicTacToe-v0", opponent=opponent, policy_player=policy_player)
    with pytest.raises(ValueError, match=re.escape(says)):
        config.check()
