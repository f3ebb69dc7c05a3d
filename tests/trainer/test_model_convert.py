"""The Megatron model built from a HF config matches the HF model: weights round-trip, logits agree."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from slimeish.trainer.convert import gather_shards, hf_to_megatron, megatron_to_hf, shard_for_rank
from slimeish.trainer.hf_io import megatron_params
from slimeish.trainer.model import build_gpt_model, gpt_logits, model_shape
from tests.trainer.trainer_helpers import load_hf_into

ARCHS = ["qwen2", "llama", "qwen3"]


def _hf_and_megatron(model_dir):
    cfg = AutoConfig.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    mg = build_gpt_model(cfg).eval()
    load_hf_into(mg, hf.state_dict(), model_shape(cfg))
    return cfg, hf, mg


@pytest.mark.parametrize("arch", ARCHS)
def test_round_trip_is_bit_exact_and_logits_match(tiny_model_factory, arch):
    cfg, hf, mg = _hf_and_megatron(tiny_model_factory(arch))
    shape = model_shape(cfg)
    assert shape.padded_vocab_size > shape.vocab_size  # the padded rows exist and must be cut again
    ref = hf.state_dict()
    back = megatron_to_hf(megatron_params(mg), shape)
    expected = set(ref) - ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
    assert set(back) == expected
    for name, tensor in back.items():
        assert torch.equal(tensor, ref[name]), name
    ids = torch.randint(0, cfg.vocab_size, (2, 23), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = gpt_logits(mg, ids, cfg.vocab_size), hf(ids).logits
    assert ours.shape == theirs.shape == (2, 23, cfg.vocab_size)
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_families_cover_bias_qk_norm_and_untied(tiny_model_factory):
    shapes = {arch: model_shape(AutoConfig.from_pretrained(tiny_model_factory(arch))) for arch in ARCHS}
    assert shapes["qwen2"].qkv_bias and not shapes["qwen2"].qk_norm
    assert shapes["qwen3"].qk_norm and not shapes["qwen3"].qkv_bias
    assert not shapes["llama"].tie_word_embeddings and shapes["qwen2"].tie_word_embeddings
    assert shapes["qwen2"].num_kv_heads < shapes["qwen2"].num_heads  # GQA


def test_tensor_parallel_shards_rejoin(tiny_model_factory):
    cfg = AutoConfig.from_pretrained(tiny_model_factory("qwen2"))
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_factory("qwen2"), dtype=torch.float32)
    full = hf_to_megatron(hf.state_dict(), model_shape(cfg, tensor_parallel=2))
    for name, tensor in full.items():
        pieces = [shard_for_rank(name, tensor, r, 2) for r in range(2)]
        assert torch.equal(gather_shards(name, pieces), tensor), name
    gate_up = shard_for_rank(
        "decoder.layers.0.mlp.linear_fc1.weight", full["decoder.layers.0.mlp.linear_fc1.weight"], 0, 2
    )
    half = cfg.intermediate_size // 2
    assert torch.equal(gate_up[:half], hf.state_dict()["model.layers.0.mlp.gate_proj.weight"][:half])


def _random_llama(rope_parameters: dict, **kw) -> tuple:
    sizes = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    cfg = LlamaConfig(
        **sizes, num_key_value_heads=2, max_position_embeddings=512, rope_parameters=rope_parameters, **kw
    )
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in hf.parameters():  # larger than the default init, so RoPE errors would show in the logits
            p.normal_(std=0.3) if p.ndim == 2 else None
    return cfg, hf


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    ],
)  # fmt: skip
def test_rope_scaling_matches_hf(rope):
    cfg, hf = _random_llama(rope)
    mg = build_gpt_model(cfg).eval()
    load_hf_into(mg, hf.state_dict(), model_shape(cfg))
    ids = torch.randint(0, 300, (1, 160), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (gpt_logits(mg, ids, 300) - hf(ids).logits).abs().max().item() <= 1e-4


def test_unsupported_settings_are_rejected():
    with pytest.raises(ValueError, match="rope_type"):
        build_gpt_model(_random_llama({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0})[0])
    with pytest.raises(ValueError, match="attention_bias"):
        build_gpt_model(_random_llama({"rope_type": "default", "rope_theta": 1e4}, attention_bias=True)[0])


def test_unsupported_family_is_rejected():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="not supported"):
        model_shape(GPT2Config())
