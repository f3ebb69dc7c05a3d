"""Qwen3-MoE, GLM-4.5 and DeepSeek-V3 in the trainer: Megatron's MoE layers built from the HF config, expert
parallel 1 on CPU.

The tiny checkpoints are written by `save_pretrained`, so they hold the per-expert names that
published Qwen3-MoE, GLM-4.5 and DeepSeek-V3 checkpoints have. The GLM-4.5 one takes the paths its
released configs leave off: group-limited routing (2 groups, the best 1) and q/k norms. DeepSeek-V3
routes in groups as its config does, and its latent attention comes with a low-rank q (V3's) and
without (`q_lora_rank: null`, V2-Lite's). Weights are drawn
larger than the default init so that the router's choices and the experts' outputs differ
visibly: a wrong expert order or router rule would move the logits far beyond the bound.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, DeepseekV3Config, Glm4MoeConfig, Qwen3MoeConfig

from slimeish.trainer.config import LossConfig, TrainerConfig
from slimeish.trainer.convert import hf_to_megatron, megatron_to_hf
from slimeish.trainer.hf_io import load_megatron_into, megatron_params, read_hf_weights
from slimeish.trainer.model import build_gpt_model, gpt_logits, model_shape
from slimeish.trainer.trainer import Trainer
from tests.trainer.trainer_helpers import random_samples


def moe_config(kind: str):
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  num_experts_per_tok=2, max_position_embeddings=512, tie_word_embeddings=False)  # fmt: skip
    if kind == "glm4_moe":  # layer 0 dense, layer 1 sparse with a shared expert
        glm = dict(n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1)
        return Glm4MoeConfig(**common, **glm, routed_scaling_factor=2.5, attention_bias=True, use_qk_norm=True)
    if kind.startswith("deepseek_v3"):  # as GLM-4.5's routing, with latent attention (every head its own k/v)
        mla = dict(q_lora_rank=None if kind.endswith("no_q_lora") else 32, kv_lora_rank=16, qk_nope_head_dim=16,
                   qk_rope_head_dim=8, v_head_dim=16, num_mtp_layers=0)  # fmt: skip
        routing = dict(n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1)
        common = common | {"num_key_value_heads": 4}
        del common["head_dim"]  # V3's config has none: the config sets it to the rotary part's width
        return DeepseekV3Config(**common, **routing, **mla, routed_scaling_factor=2.5)
    return Qwen3MoeConfig(**common, num_experts=4, norm_topk_prob=kind == "norm_topk")


@pytest.fixture(
    scope="module", params=["norm_topk", "no_norm_topk", "glm4_moe", "deepseek_v3", "deepseek_v3_no_q_lora"]
)
def moe_dir(request, tmp_path_factory):
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(moe_config(request.param), dtype=torch.float32)
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim >= 2:
                p.normal_(std=0.3)
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):  # a trained model's is not zero
                b.normal_(std=0.3)
    out = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(out)
    return out


def test_round_trip_is_bit_exact_and_logits_match(moe_dir):
    cfg = AutoConfig.from_pretrained(moe_dir)
    shape = model_shape(cfg)
    ref = read_hf_weights(moe_dir)
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in ref and "model.layers.1.mlp.gate.weight" in ref
    mg = build_gpt_model(cfg).eval()
    load_megatron_into(mg, hf_to_megatron(ref, shape))
    back = megatron_to_hf(megatron_params(mg), shape)
    assert set(back) == set(ref)
    for name, tensor in back.items():
        assert torch.equal(tensor, ref[name]), name
    hf = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 23), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = gpt_logits(mg, ids, cfg.vocab_size), hf(ids).logits
    assert theirs.abs().max().item() > 1.0  # large enough that an error would show
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_the_tiny_deepseek_v3_is_config_exact_and_megatron_matches_it(tiny_model_factory):
    """`make-tiny-model --arch deepseek_v3`: V3's config keys (latent attention with a q rank, group
    routing with num_experts_per_tok = 2 x topk_group, a dense first layer, a shared expert, every
    head its own k/v, plain RoPE), and Megatron's logits on it are transformers'."""
    path = tiny_model_factory("deepseek_v3", family="deepseek-v3")
    cfg = AutoConfig.from_pretrained(path)
    assert (cfg.n_group, cfg.topk_group, cfg.num_experts_per_tok, cfg.first_k_dense_replace) == (2, 1, 2, 1)
    assert cfg.q_lora_rank and cfg.kv_lora_rank and cfg.n_shared_experts == 1 and cfg.rope_interleave
    assert cfg.num_key_value_heads == cfg.num_attention_heads and cfg.rope_parameters["rope_type"] == "default"
    mg = build_gpt_model(cfg).eval()
    load_megatron_into(mg, hf_to_megatron(read_hf_weights(path), model_shape(cfg)))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 23), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(gpt_logits(mg, ids, cfg.vocab_size), hf(ids).logits, rtol=0, atol=1e-5)


def test_a_step_trains_router_and_experts_and_exports_loadable_weights(moe_dir, tmp_path):
    trainer = Trainer(TrainerConfig(model_path=moe_dir, lr=1e-2), LossConfig())
    before = trainer.hf_state_dict()
    metrics = trainer.train_step(random_samples(2, 3, seed=3, vocab=300))
    assert all(math.isfinite(v) for v in metrics.values())
    after = trainer.hf_state_dict()
    assert set(after) == set(before)
    for name in ("model.layers.1.mlp.gate.weight", "model.layers.1.mlp.experts.0.gate_proj.weight"):
        assert not torch.equal(before[name], after[name]), name
    hf = AutoModelForCausalLM.from_pretrained(trainer.export_hf(tmp_path / "hf"), dtype=torch.float32).eval()
    samples = random_samples(1, 2, seed=4, vocab=300)
    ours = trainer.compute_log_probs(samples)
    for s, lp in zip(samples, ours, strict=True):
        with torch.no_grad():
            logits = hf(torch.tensor([s.tokens])).logits[0, :-1].log_softmax(-1)
        ref = logits.gather(-1, torch.tensor(s.tokens[1:]).unsqueeze(-1)).squeeze(-1)[-s.response_length :]
        torch.testing.assert_close(torch.tensor(lp), ref, rtol=0, atol=1e-4)


def test_dense_layers_between_moe_layers_are_refused(tmp_path):
    cfg = Qwen3MoeConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, num_experts=4, mlp_only_layers=[1])  # fmt: skip
    with pytest.raises(ValueError, match="mlp_only_layers"):
        build_gpt_model(cfg)


@pytest.mark.parametrize(
    "moe_dir", ["norm_topk", "no_norm_topk"], indirect=True
)  # GLM-4.5, DeepSeek-V3 train without one
def test_the_load_balancing_loss_is_reported_and_alone_trains_the_routers(moe_dir):
    """Equal rewards give zero advantages, so the policy loss has no gradient: whatever moves is
    moved by the aux loss, which reaches the routers and everything below them, but not the last
    layer's experts, whose output feeds only the (gradient-free) policy loss."""
    trainer = Trainer(TrainerConfig(model_path=moe_dir, lr=1e-2, micro_batch_tokens=16), LossConfig())
    samples = random_samples(2, 3, seed=5, vocab=300)
    for s in samples:
        s.reward = 1.0
    before = trainer.hf_state_dict()
    metrics = trainer.train_step(samples)
    after = trainer.hf_state_dict()
    assert metrics["moe_aux_loss"] > 0 and metrics["grad_norm"] > 0
    assert not torch.equal(before["model.layers.1.mlp.gate.weight"], after["model.layers.1.mlp.gate.weight"])
    experts = [k for k in before if k.startswith("model.layers.1.mlp.experts.")]
    assert experts and all(torch.equal(before[k], after[k]) for k in experts)
