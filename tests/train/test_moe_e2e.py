"""`slimeish train` on the Qwen3-MoE, GLM-4.5 and DeepSeek-V3 tiny models: an `openai` SDK agent
through the router with the family's renderer, the engine recording each token's experts, the
trainer replaying them (R3)."""

from __future__ import annotations

import pytest

from tests.train.test_train_e2e import metrics, run_train, train_argv

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "arch, family", [("qwen3_moe", "qwen3"), ("glm4_moe", "glm-4.5"), ("deepseek_v3", "deepseek-v3")]
)
def test_three_replayed_steps_through_the_router(tiny_model_factory, prompts, valkey, tmp_path, arch, family):
    model = tiny_model_factory(arch, family=family)
    # the run id is the run dir's name, and the buffer (one valkey per session) outlives the test:
    # one run id per arch, or a later arch's run finds an earlier one's group places held
    run_dir = tmp_path / f"moe-{arch}"
    argv = train_argv(
        model, prompts, run_dir, valkey.url, "--num-rollout", "3", "--use-rollout-routing-replay",
        "--rollout-function-path", "slimeish.rollout_functions.openai_agent.generate_rollout",
        "--agent-function-path", "tests.train.reference_plugins.two_turn_chat_agent",
    )  # fmt: skip
    run_train(argv, tmp_path / "moe.log")
    steps = [r for r in metrics(run_dir) if "train/loss" in r]
    assert [r["step"] for r in steps] == [0, 1, 2]
    for r in steps:
        # every trained token carried the engine's experts, and the forward took them
        assert r["train/routing_mismatch"] == 0.0
        # the weights are synced, so the trainer's own router mostly agrees with the engine's
        assert 0.0 <= r["train/routing_mismatch_own"] < 0.2
        # Qwen3-MoE trains with a load-balancing loss; GLM-4.5 and DeepSeek-V3 balance by their routers' bias
        assert (r["train/moe_aux_loss"] > 0) == (arch == "qwen3_moe")
