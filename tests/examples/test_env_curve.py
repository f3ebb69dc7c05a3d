"""examples/env_curve: its pieces, and its whole pipeline in a tiny setting (the pieces connect;
learning is the example's own run, in its README)."""

from __future__ import annotations

import json
import random
import sys

import pytest
from safetensors.torch import load_file

from examples.env_curve.run import ENV_ID, EnvCurveConfig, env_train_setup, teacher_messages, write_data
from slimeish.buffer import EmbeddedServer
from slimeish.common.procs import ManagedProcess
from slimeish.train.metrics import read_metrics
from slimeish.train.setup import check_plugins, command_line, parse_args
from tests.environments.conftest import finish_scores, stored_samples


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_held_out_words_are_not_train_words(tmp_path):
    train, eval_ = write_data(tmp_path, EnvCurveConfig(n_train=200, n_eval=16))
    words = [{r["label"]["metadata"]["word"].lower() for r in records(path)} for path in (train, eval_)]
    assert len(records(eval_)) == 16 and words[0].isdisjoint(words[1])
    assert all(len(w) == 3 for w in words[0] | words[1])  # the easiest setting: --word-len 3


def test_the_teacher_mostly_copies_forward():
    record = {
        "prompt": [{"role": "user", "content": "Spell this word backward: cat"}],
        "label": {"metadata": {"word": "cat"}},
    }
    rng = random.Random(0)
    replies = [teacher_messages(record, rng, 0.25)[-1]["content"] for _ in range(2000)]
    assert set(replies) == {"<answer>tac</answer>", "<answer>cat</answer>"}
    assert replies.count("<answer>tac</answer>") / 2000 == pytest.approx(0.25, abs=0.03)


def test_the_recipe_is_the_demos_with_the_reasoning_gym_adapter(tmp_path):
    cfg = EnvCurveConfig(run_dir=tmp_path)
    setup = env_train_setup(cfg, tmp_path / "train.jsonl", tmp_path / "eval.jsonl", tmp_path / "warm")
    assert parse_args(command_line(setup)) == setup  # the same run as a `slimeish train` command
    check_plugins(setup)
    assert setup.plugin.env_id == ENV_ID and setup.plugin.env_args == {"min_word_len": 3, "max_word_len": 3}
    assert setup.rollout.eval_temperature == 0.0 and setup.loss.kl_coef == cfg.kl_coef > 0


@pytest.mark.slow
def test_the_pipeline_connects_in_a_tiny_setting(tmp_path):
    """Data -> tiny model -> warm-start -> `slimeish train` with the adapter, held-out eval every step."""
    argv = [
        sys.executable, "-m", "examples.env_curve.run", "--run-dir", str(tmp_path), "--n-train", "32",
        "--n-eval", "4", "--sft-short-steps", "2", "--sft-steps", "1", "--sft-batch-size", "4", "--num-rollout", "2",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--eval-interval", "1", "--response-len", "8",
    ]  # fmt: skip
    log = tmp_path / "run.log"
    with ManagedProcess(argv, log_path=log) as proc:
        assert proc.proc.wait(600) == 0, log.read_text()[-4000:]
    text = log.read_text()

    base, warm = load_file(tmp_path / "base/model.safetensors"), load_file(tmp_path / "warm/model.safetensors")
    assert any(not base[k].equal(warm[k]) for k in base), "the warm-start changed the weights"
    assert "[warm-start sft] step 3/3 (full)" in text  # both phases ran

    rows = read_metrics(tmp_path / "rl")
    evals = {r["step"]: r for r in rows if "eval/reward_mean" in r}
    assert sorted(evals) == [0, 1, 2] and all(r["eval/episodes"] == 4 for r in evals.values())
    assert "held-out eval reward by step: 0:" in text  # the summary the README quotes

    # the rollouts were finished with reasoning-gym's scorer: its named parts beside the reward
    with EmbeddedServer(tmp_path / "rl/buffer") as buffer:
        samples = stored_samples(buffer.url, "rl")
        assert len(samples) >= 2 * 2 * 2  # the trained groups (and the held-out evaluations)
        scores = finish_scores(buffer.url, "rl", [s.session_id for s in samples])
    assert all({"score", "answered"} <= set(named) for named in scores)
    assert all(s.reward == named["score"] for s, named in zip(samples, scores, strict=True))
