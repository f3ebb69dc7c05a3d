"""Qwen3-MoE, GLM-4.5 and DeepSeek-V3 between the embedded engine and the trainer: log-prob parity,
weights by checkpoint names, the routed experts the engine records, and routing replay (R3).

The models are `make-tiny-model --arch qwen3_moe --family qwen3` (config-exact Qwen3-MoE: every
layer sparse, 4 experts, top-2, renormalised), `--arch glm4_moe --family glm-4.5` (config-exact
GLM-4.5: layer 0 dense, layer 1 sigmoid-routed with a correction bias and a shared expert) and
`--arch deepseek_v3 --family deepseek-v3` (config-exact DeepSeek-V3: GLM-4.5's routing within the
best of 2 expert groups, MLA attention whose latents the engine caches). The engine runs
in-process (its scheduler and runner); its HTTP side is covered in tests/engine/test_server.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from slimeish.common.routed_experts import decode_routed_experts, encode_routed_experts
from slimeish.common.sample import Sample
from slimeish.engine.model_runner import ModelRunner, PrefillChunk
from slimeish.engine.moe import moe_routers
from slimeish.trainer.config import LossConfig, TrainerConfig
from slimeish.trainer.trainer import Trainer

PAGE = 4


FAMILY = {"qwen3_moe": "qwen3", "glm4_moe": "glm-4.5", "deepseek_v3": "deepseek-v3"}
# the published checkpoints' config keys, as make-tiny-model writes them
CONFIG_KEYS = {
    "qwen3_moe": {"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
                  "head_dim": 16, "tie_word_embeddings": False},
    "glm4_moe": {"architectures": ["Glm4MoeForCausalLM"], "n_routed_experts": 4, "num_experts_per_tok": 2,
                 "moe_intermediate_size": 32, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1,
                 "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "attention_bias": True,
                 "use_qk_norm": False, "head_dim": 16, "tie_word_embeddings": False,
                 "rope_parameters": {"partial_rotary_factor": 0.5, "rope_theta": 10000.0, "rope_type": "default"}},
    "deepseek_v3": {"architectures": ["DeepseekV3ForCausalLM"], "n_routed_experts": 4, "num_experts_per_tok": 2,
                    "moe_intermediate_size": 32, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2,
                    "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "q_lora_rank": 32,
                    "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
                    "rope_interleave": True, "tie_word_embeddings": False},
}  # fmt: skip


@pytest.fixture(scope="module", params=list(FAMILY))
def moe_model(request, tiny_model_factory):
    return tiny_model_factory(request.param, family=FAMILY[request.param])


def engine_pass(runner: ModelRunner, tokens: list[int], first_page: int) -> tuple[list[float], str]:
    """Teacher-forced engine pass over `tokens`: log p(tokens[p] | tokens[:p]) for p >= 1 and the
    routes of tokens[:-1], as a finished generation of those tokens would report them."""
    pages = list(range(first_page, first_page + -(-len(tokens) // PAGE)))
    [(_, log_probs)] = runner.prefill([PrefillChunk(tokens, 0, len(tokens), pages, 1)], len(tokens))
    return log_probs, encode_routed_experts(runner.routed_experts(pages, len(tokens) - 1))


def engine_samples(runner: ModelRunner, n: int, seed: int) -> list[Sample]:
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        tokens = torch.randint(0, runner.vocab_size, (int(torch.randint(12, 40, (1,), generator=gen)),), generator=gen)
        log_probs, routes = engine_pass(runner, tokens.tolist(), first_page=i * 16)
        response = len(tokens) // 2
        sample = Sample(group_index=i // 2, index=i % 2, tokens=tokens.tolist(), response_length=response)
        sample.reward, sample.rollout_log_probs = float(i % 2), log_probs[-response:]
        sample.rollout_routed_experts = routes
        samples.append(sample)
    return samples


def make_runner(path) -> ModelRunner:
    runner = ModelRunner(str(path), device="cpu", dtype="float32")
    runner.allocate_kv(num_pages=256, page_size=PAGE)
    return runner


def gap(trainer: Trainer, samples: list[Sample]) -> tuple[float, float]:
    ours = trainer.compute_log_probs(samples)
    diffs = torch.cat([torch.tensor(o) - torch.tensor(s.rollout_log_probs) for o, s in zip(ours, samples, strict=True)])
    return diffs.abs().max().item(), diffs.abs().mean().item()


def test_the_tiny_model_has_the_published_config_keys(moe_model):
    config = json.loads((moe_model / "config.json").read_text())
    expected = CONFIG_KEYS[config["model_type"]]
    assert {k: config.get(k) for k in expected} == expected
    assert "num_local_experts" not in config


def test_engine_and_trainer_log_probs_agree_and_the_routes_are_the_trainers(moe_model):
    runner = make_runner(moe_model)
    samples = engine_samples(runner, 4, seed=0)
    routes = decode_routed_experts(samples[0].rollout_routed_experts, len(samples[0].tokens) - 1)
    moe_layers = len(moe_routers(runner.model))
    # GLM-4.5's and DeepSeek-V3's first layer is dense
    assert moe_layers == {"qwen3_moe": 2, "glm4_moe": 1, "deepseek_v3": 1}[runner.model.config.model_type]
    assert routes.shape == (len(samples[0].tokens) - 1, moe_layers * 2)  # tokens x (MoE layers x top-k)
    assert routes.min() >= 0 and routes.max() < 4
    trainer = Trainer(TrainerConfig(model_path=moe_model), LossConfig())
    assert gap(trainer, samples)[0] <= 1e-5
    mismatch = trainer.routing.take_mismatch()
    assert mismatch == {"routing_mismatch_own": 0.0, "routing_mismatch": 0.0}


def test_the_engine_takes_the_trainers_per_expert_weights(moe_model, tmp_path):
    trainer = Trainer(TrainerConfig(model_path=moe_model, lr=1e-2), LossConfig())
    runner = make_runner(moe_model)
    trainer.train_step(engine_samples(runner, 4, seed=1))
    exported = trainer.export_hf(tmp_path / "hf")
    assert runner.load_checkpoint_dir(exported) > 0
    samples = engine_samples(runner, 2, seed=2)
    assert gap(trainer, samples)[0] <= 1e-5


def perturbed_engine(moe_model, scale: float) -> ModelRunner:
    """An engine whose routers are off by noise, as a different kernel's rounding would leave them."""
    runner = make_runner(moe_model)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for router in moe_routers(runner.model):
            w = router.weight
            w += scale * w.abs().mean() * torch.randn(w.shape, generator=gen)
    return runner


def test_replay_removes_the_routing_mismatch_and_shrinks_the_log_prob_gap(moe_model):
    samples = engine_samples(perturbed_engine(moe_model, scale=0.5), 8, seed=3)
    results = {}
    for replay in (False, True):
        trainer = Trainer(TrainerConfig(model_path=moe_model, use_rollout_routing_replay=replay), LossConfig())
        max_gap, mean_gap = gap(trainer, samples)
        results[replay] = (trainer.routing.take_mismatch(), max_gap, mean_gap)
    (off, off_max, off_mean), (on, on_max, on_mean) = results[False], results[True]
    # the perturbation flips routes (with replay, Qwen3-MoE's layer 1 sees other inputs, so its own top-k moves too)
    assert off["routing_mismatch_own"] > 0.05 and on["routing_mismatch_own"] > 0.05
    assert off["routing_mismatch"] == off["routing_mismatch_own"] and on["routing_mismatch"] == 0.0
    assert on_mean < off_mean and on_max < off_max
    print(f"R3 off: mismatch {off['routing_mismatch']:.3f} |dlogp| mean {off_mean:.2e} max {off_max:.2e}; "
          f"on: mismatch {on['routing_mismatch']:.3f} |dlogp| mean {on_mean:.2e} max {on_max:.2e}")  # fmt: skip


def test_a_replayed_train_step_reports_the_mismatch_and_trains_the_router(moe_model):
    samples = engine_samples(perturbed_engine(moe_model, scale=0.5), 4, seed=4)
    trainer = Trainer(TrainerConfig(model_path=moe_model, lr=1e-2, use_rollout_routing_replay=True), LossConfig())
    before = trainer.hf_state_dict()["model.layers.1.mlp.gate.weight"]
    metrics = trainer.train_step(samples)
    assert metrics["routing_mismatch"] == 0.0 and metrics["routing_mismatch_own"] > 0
    assert not torch.equal(before, trainer.hf_state_dict()["model.layers.1.mlp.gate.weight"])
