"""Weight conversion between Hugging Face (Llama, Qwen2, Qwen3, Qwen3-MoE, GLM-4.5, DeepSeek-V3) and Megatron names.

Both directions work on full (unsharded) tensors; `shard_for_rank` / `gather_shards` cut and join
the tensor-parallel pieces for TP > 1. Megatron's fused QKV weight is laid out per query group:
for each KV head g, the rows of its q heads, then k_g, then v_g. Megatron's fused fc1 is
[gate; up]. The word embedding (and untied output layer) carry extra zero rows up to the padded
vocab, dropped again on the way back, so HF -> Megatron -> HF is bit-exact. MoE layers use the
checkpoint's per-expert names (`mlp.experts.E.gate_proj`, ..., router `mlp.gate`), the layout
Qwen3-MoE and GLM-4.5 checkpoints are published in and `save_pretrained` writes; GLM-4.5's router
also carries `mlp.gate.e_score_correction_bias` (Megatron's `router.expert_bias`), its MoE layers a
dense `mlp.shared_experts`, and its first `first_k_dense_replace` layers a dense MLP. DeepSeek-V3
routes as GLM-4.5 and its latent attention maps one HF weight to one Megatron weight, unchanged
(`_MLA_NAMES`: Megatron's kv up-projection has HF's per-head [k_nope; v] rows).
"""

from __future__ import annotations

import torch
from torch import Tensor

from slimeish.trainer.model import ModelShape

Tensors = dict[str, Tensor]


def _qkv_to_megatron(q: Tensor, k: Tensor, v: Tensor, shape: ModelShape) -> Tensor:
    per_group = shape.num_heads // shape.num_kv_heads
    g, d = shape.num_kv_heads, shape.head_dim
    q = q.reshape(g, per_group * d, *q.shape[1:])
    k = k.reshape(g, d, *k.shape[1:])
    v = v.reshape(g, d, *v.shape[1:])
    return torch.cat([q, k, v], dim=1).reshape(-1, *q.shape[2:])


def qkv_from_megatron(qkv: Tensor, shape: ModelShape) -> tuple[Tensor, Tensor, Tensor]:
    per_group = shape.num_heads // shape.num_kv_heads
    g, d = shape.num_kv_heads, shape.head_dim
    grouped = qkv.reshape(g, (per_group + 2) * d, *qkv.shape[1:])
    q, k, v = torch.split(grouped, [per_group * d, d, d], dim=1)
    return (t.reshape(-1, *qkv.shape[1:]).contiguous() for t in (q, k, v))  # type: ignore[return-value]


def _pad_vocab(w: Tensor, shape: ModelShape) -> Tensor:
    pad = shape.padded_vocab_size - w.shape[0]
    return torch.cat([w, w.new_zeros(pad, *w.shape[1:])]) if pad else w.clone()


# DeepSeek-V3's latent attention, (Megatron, HF) names under `self_attention.` / `self_attn.`.
_MLA_NAMES = [
    ("linear_kv_down_proj.weight", "kv_a_proj_with_mqa.weight"),
    ("kv_layernorm.weight", "kv_a_layernorm.weight"),
    ("linear_kv_up_proj.weight", "kv_b_proj.weight"),
    ("linear_proj.weight", "o_proj.weight"),
]
_MLA_Q_LORA = [
    ("linear_q_down_proj.weight", "q_a_proj.weight"),
    ("q_layernorm.weight", "q_a_layernorm.weight"),
    ("linear_q_up_proj.weight", "q_b_proj.weight"),
]


def _mla_names(shape: ModelShape) -> list[tuple[str, str]]:
    assert shape.mla is not None
    return _MLA_NAMES + (_MLA_Q_LORA if shape.mla.q_lora_rank else [("linear_q_proj.weight", "q_proj.weight")])


def hf_to_megatron(hf: Tensors, shape: ModelShape) -> Tensors:
    """Full HF state dict -> full Megatron state dict (tensors are copies)."""
    out: Tensors = {
        "embedding.word_embeddings.weight": _pad_vocab(hf["model.embed_tokens.weight"], shape),
        "decoder.final_layernorm.weight": hf["model.norm.weight"].clone(),
    }
    if not shape.tie_word_embeddings:
        out["output_layer.weight"] = _pad_vocab(hf["lm_head.weight"], shape)
    for i in range(shape.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        att = h + "self_attn."
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"].clone()
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"].clone()
        out.update(_mlp_to_megatron(hf, h + "mlp.", m + "mlp.", shape.is_moe_layer(i), shape))
        if shape.mla:
            out.update({m + "self_attention." + mn: hf[att + hn].clone() for mn, hn in _mla_names(shape)})
            continue
        out[m + "self_attention.linear_qkv.weight"] = _qkv_to_megatron(
            hf[att + "q_proj.weight"], hf[att + "k_proj.weight"], hf[att + "v_proj.weight"], shape
        )
        if shape.qkv_bias:
            out[m + "self_attention.linear_qkv.bias"] = _qkv_to_megatron(
                hf[att + "q_proj.bias"], hf[att + "k_proj.bias"], hf[att + "v_proj.bias"], shape
            )
        if shape.qk_norm:
            out[m + "self_attention.q_layernorm.weight"] = hf[att + "q_norm.weight"].clone()
            out[m + "self_attention.k_layernorm.weight"] = hf[att + "k_norm.weight"].clone()
        out[m + "self_attention.linear_proj.weight"] = hf[att + "o_proj.weight"].clone()
    return out


def _mlp_pairs(m: str, h: str, moe: bool, shape: ModelShape) -> list[tuple[str, str]]:
    """The (Megatron, HF) prefixes of one layer's gated MLPs: the dense one, or each expert and the shared experts."""
    if not moe:
        return [(m, h)]
    pairs = [(f"{m}experts.local_experts.{e}.", f"{h}experts.{e}.") for e in range(shape.num_experts)]
    return pairs + ([(m + "shared_experts.", h + "shared_experts.")] if shape.shared_expert_size else [])


def _router_names(m: str, h: str, shape: ModelShape) -> list[tuple[str, str]]:
    names = [(m + "router.weight", h + "gate.weight")]
    return names + ([(m + "router.expert_bias", h + "gate.e_score_correction_bias")] if shape.expert_bias else [])


def _mlp_to_megatron(hf: Tensors, h: str, m: str, moe: bool, shape: ModelShape) -> Tensors:
    """One layer's MLP (h, m: the HF and Megatron `...mlp.` prefixes): dense, or router + experts."""
    out = {mn: hf[hn].clone() for mn, hn in _router_names(m, h, shape)} if moe else {}
    for me, he in _mlp_pairs(m, h, moe, shape):
        out[me + "linear_fc1.weight"] = torch.cat([hf[he + "gate_proj.weight"], hf[he + "up_proj.weight"]])
        out[me + "linear_fc2.weight"] = hf[he + "down_proj.weight"].clone()
    return out


def _mlp_from_megatron(mg: Tensors, m: str, h: str, moe: bool, shape: ModelShape) -> Tensors:
    """Inverse of `_mlp_to_megatron`."""
    out = {hn: mg[mn] for mn, hn in _router_names(m, h, shape)} if moe else {}
    for me, he in _mlp_pairs(m, h, moe, shape):
        gate, up = mg[me + "linear_fc1.weight"].chunk(2)
        out[he + "gate_proj.weight"], out[he + "up_proj.weight"] = gate.contiguous(), up.contiguous()
        out[he + "down_proj.weight"] = mg[me + "linear_fc2.weight"]
    return out


def megatron_to_hf(mg: Tensors, shape: ModelShape) -> Tensors:
    """Full Megatron state dict -> full HF state dict (tied models get no `lm_head.weight`)."""
    v = shape.vocab_size
    out: Tensors = {
        "model.embed_tokens.weight": mg["embedding.word_embeddings.weight"][:v].contiguous(),
        "model.norm.weight": mg["decoder.final_layernorm.weight"],
    }
    if not shape.tie_word_embeddings:
        out["lm_head.weight"] = mg["output_layer.weight"][:v].contiguous()
    for i in range(shape.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        att = h + "self_attn."
        out[h + "input_layernorm.weight"] = mg[m + "input_layernorm.weight"]
        out[h + "post_attention_layernorm.weight"] = mg[m + "pre_mlp_layernorm.weight"]
        out.update(_mlp_from_megatron(mg, m + "mlp.", h + "mlp.", shape.is_moe_layer(i), shape))
        if shape.mla:
            out.update({att + hn: mg[m + "self_attention." + mn] for mn, hn in _mla_names(shape)})
            continue
        qkv = qkv_from_megatron(mg[m + "self_attention.linear_qkv.weight"], shape)
        out.update(zip((att + "q_proj.weight", att + "k_proj.weight", att + "v_proj.weight"), qkv, strict=True))
        if shape.qkv_bias:
            qkv_b = qkv_from_megatron(mg[m + "self_attention.linear_qkv.bias"], shape)
            out.update(zip((att + "q_proj.bias", att + "k_proj.bias", att + "v_proj.bias"), qkv_b, strict=True))
        if shape.qk_norm:
            out[att + "q_norm.weight"] = mg[m + "self_attention.q_layernorm.weight"]
            out[att + "k_norm.weight"] = mg[m + "self_attention.k_layernorm.weight"]
        out[att + "o_proj.weight"] = mg[m + "self_attention.linear_proj.weight"]
    return out


# Tensor-parallel layout of each Megatron parameter: the dim it is split on (None = replicated).
def _tp_dim(name: str) -> int | None:
    if name.endswith(
        ("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight", "word_embeddings.weight", "output_layer.weight")
    ):
        return 0
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1
    return None


def shard_for_rank(name: str, full: Tensor, rank: int, world: int) -> Tensor:
    """This TP rank's piece of a full Megatron tensor (fc1 splits gate and up separately)."""
    dim = _tp_dim(name)
    if dim is None or world == 1:
        return full
    if name.endswith("linear_fc1.weight"):
        gate, up = full.chunk(2)
        return torch.cat([gate.chunk(world)[rank], up.chunk(world)[rank]])
    return full.chunk(world, dim=dim)[rank]  # qkv: whole query groups per rank, by construction


def gather_shards(name: str, shards: list[Tensor]) -> Tensor:
    """Inverse of `shard_for_rank` over all TP ranks' pieces."""
    dim = _tp_dim(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    if name.endswith("linear_fc1.weight"):
        halves = [s.chunk(2) for s in shards]
        return torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
    return torch.cat(shards, dim=dim)
