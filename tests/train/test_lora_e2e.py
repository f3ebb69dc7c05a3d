"""`slimeish train --lora-rank`: the engines sample with the trainer's adapter from the first turn
(loaded before any rollout, then pushed alone after each step), unmerged, so the engine's log-probs
are the trainer's."""

from __future__ import annotations

import httpx
import pytest

from slimeish.train.setup import parse_args
from tests.router.conftest import start_engine
from tests.train.test_train_e2e import metrics, run_train, train_argv

pytestmark = pytest.mark.slow


def test_three_lora_steps_through_the_router(tiny_model, prompts, valkey, tmp_path):
    """On an engine the run does not own (one other runs may share), which it leaves as it found it."""
    engine, url = start_engine(tiny_model, tmp_path)
    run_dir = tmp_path / "lora"
    argv = train_argv(
        tiny_model, prompts, run_dir, valkey.url, "--num-rollout", "3", "--lora-rank", "8", "--engine-url", url,
        "--rollout-function-path", "slimeish.rollout_functions.openai_agent.generate_rollout",
        "--agent-function-path", "tests.train.reference_plugins.two_turn_chat_agent",
    )  # fmt: skip
    with engine:
        run_train(argv, tmp_path / "lora.log")
        info = httpx.get(f"{url}/model_info").json()
    assert info["lora_weight_versions"] == {}  # the finished run unloaded its adapter
    steps = [r for r in metrics(run_dir) if "train/loss" in r]
    assert [r["step"] for r in steps] == [0, 1, 2]
    for r in steps:
        # the engine sampled with the adapter the trainer had: without it the gap is the adapter's effect
        assert r["train/rollout_logprob_abs_diff_max"] <= 1e-4, r
        assert r["train/weight_version"] == r["step"] + 1


def test_a_lora_run_with_the_nccl_sync_is_refused_at_start():
    argv = ["--prompt-data", "p.jsonl", "--model-path", "m", "--lora-rank", "8", "--weight-sync", "distributed"]
    with pytest.raises(ValueError, match="--weight-sync tensor or disk"):
        parse_args(argv)


def test_lora_on_the_tiny_qwen3_moe_with_routing_replay(tiny_model_factory, prompts, valkey, tmp_path):
    """Adapters on attention and every routed expert (the default targets); the engine routes and
    samples with the adapter, the trainer replays its routes (R3) and gets its log-probs."""
    model = tiny_model_factory("qwen3_moe", family="qwen3")
    run_dir = tmp_path / "lora-moe"
    argv = train_argv(
        model, prompts, run_dir, valkey.url, "--num-rollout", "2", "--lora-rank", "4",
        "--use-rollout-routing-replay",
        "--rollout-function-path", "slimeish.rollout_functions.openai_agent.generate_rollout",
        "--agent-function-path", "tests.train.reference_plugins.two_turn_chat_agent",
    )  # fmt: skip
    run_train(argv, tmp_path / "lora-moe.log")
    steps = [r for r in metrics(run_dir) if "train/loss" in r]
    assert [r["step"] for r in steps] == [0, 1]
    for r in steps:
        assert r["train/routing_mismatch"] == 0.0
        assert r["train/rollout_logprob_abs_diff_max"] <= 1e-4, r
        assert r["train/weight_version"] == r["step"] + 1
