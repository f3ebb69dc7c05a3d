"""The dense Llama-family decoder stack (Llama, Qwen2, Qwen3) as plain tensor ops over fused weights.

For a model this small a forward's cost is the number of ops it dispatches, not their arithmetic:
through the Hugging Face modules a decode step at one sequence spent about a quarter of its CPU in
`nn.Module` calls, attribute lookups and the layers' Python. Here each layer is one fused Q/K/V
projection, one fused gate/up projection (as SGLang's models hold them: `qkv_proj`,
`gate_up_proj`), `rms_norm` as one op, and the rotary embedding applied to the queries and keys
together with one `roll` in place of `rotate_half`'s slices, negation and concatenation.

The fused weights are the model's own storage: each projection's `weight` (and `bias`) becomes a
view into its fused tensor, so every weight update (`ModelRunner._copy_in` copies into the
parameters) lands in both, and the module path (`ModelRunner._stack`, which MoE and MLA models,
and rows that use a LoRA adapter, take: the adapters hook the modules) reads the same numbers.
The math is the modules', op for op, but for rounding (a fused `rms_norm` and a wider matmul may
round differently); `tests/engine/test_fused_decoder.py` holds the two paths' tokens and
log-probs to each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from slimeish.engine.attention import ChunkSpan, MixedStep, paged_attention

# model types whose decoder layers are the plain pre-norm attention + gated MLP this module runs
FUSED_TYPES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True, slots=True)
class _Layer:
    attn: nn.Module  # the HF attention module: `paged_attention` takes it (its off-CPU path needs it)
    input_norm: Tensor
    qkv: Tensor
    qkv_bias: Tensor | None
    q_norm: Tensor | None  # Qwen3's per-head norms of the queries and keys
    k_norm: Tensor | None
    o: Tensor
    o_bias: Tensor | None
    post_norm: Tensor
    gate_up: Tensor
    gate_up_bias: Tensor | None
    down: Tensor
    down_bias: Tensor | None


def _fuse(linears: list[Any]) -> tuple[Tensor, Tensor | None]:
    """One `[sum(out), in]` weight (and bias) for `linears`, whose parameters become views into it."""
    weight = torch.cat([m.weight.data for m in linears])
    bias = torch.cat([m.bias.data for m in linears]) if linears[0].bias is not None else None
    at = 0
    for m in linears:
        rows = m.weight.shape[0]
        m.weight.data = weight[at : at + rows]
        if bias is not None:
            m.bias.data = bias[at : at + rows]
        at += rows
    return weight, bias


class FusedDecoder:
    """Runs `model.model`'s decoder layers like `ModelRunner._stack`, with the same cache and masks."""

    def __init__(self, model: nn.Module):
        # HF config and submodules: attributes `nn.Module.__getattr__` types as `Tensor | Module`
        hf: Any = model
        cfg, inner = hf.config, hf.model
        assert cfg.model_type in FUSED_TYPES, cfg.model_type
        self.embed, self.rotary = inner.embed_tokens, inner.rotary_emb
        self.norm, self.lm_head = inner.norm.weight, hf.lm_head.weight
        self.eps = float(cfg.rms_norm_eps)
        self.head_dim = inner.layers[0].self_attn.head_dim
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.scaling = inner.layers[0].self_attn.scaling
        self.act = inner.layers[0].mlp.act_fn
        self.intermediate = cfg.intermediate_size
        self.layers = [self._layer(layer) for layer in inner.layers]

    @staticmethod
    def _layer(layer: Any) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        qkv, qkv_bias = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
        gate_up, gate_up_bias = _fuse([mlp.gate_proj, mlp.up_proj])
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        return _Layer(
            attn, layer.input_layernorm.weight, qkv, qkv_bias,
            None if q_norm is None else q_norm.weight, None if k_norm is None else k_norm.weight,
            attn.o_proj.weight, attn.o_proj.bias, layer.post_attention_layernorm.weight, gate_up, gate_up_bias,
            mlp.down_proj.weight, mlp.down_proj.bias,
        )  # fmt: skip

    def __call__(self, ids: Tensor, positions: Tensor, mask: Tensor | ChunkSpan | MixedStep, cache) -> Tensor:
        """Hidden states `[n, width, hidden]` (before the final norm) of `ids` at `positions`
        (`[n, width]` each); `cache` is the `PagedKV` set up for this step."""
        n, width = ids.shape
        hidden = self.embed(ids)
        cos, sin = self.rotary(hidden, positions)
        # rotate_half(x) * sin == roll(x, half) * (sin with its first half negated)
        half = self.head_dim // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        cos, sin = cos[:, :, None], sin[:, :, None]  # [n, width, 1, head_dim]: over every head
        q_end, k_end = self.heads, self.heads + self.kv_heads
        size = (hidden.shape[-1],)
        for i, layer in enumerate(self.layers):
            x = F.rms_norm(hidden, size, layer.input_norm, self.eps)
            qkv = F.linear(x, layer.qkv, layer.qkv_bias).view(n, width, k_end + self.kv_heads, self.head_dim)
            qk = qkv[:, :, :k_end]
            if layer.q_norm is not None:
                q = F.rms_norm(qk[:, :, :q_end], (self.head_dim,), layer.q_norm, self.eps)
                k = F.rms_norm(qk[:, :, q_end:], (self.head_dim,), layer.k_norm, self.eps)
                qk = torch.cat((q, k), dim=2)
            qk = qk * cos + qk.roll(half, -1) * sin
            key, value = cache.update(qk[:, :, q_end:].transpose(1, 2), qkv[:, :, k_end:].transpose(1, 2), i)
            out, _ = paged_attention(layer.attn, qk[:, :, :q_end].transpose(1, 2), key, value, mask,
                                     scaling=self.scaling)  # fmt: skip
            hidden = hidden + F.linear(out.reshape(n, width, -1), layer.o, layer.o_bias)
            gate_up = F.linear(F.rms_norm(hidden, size, layer.post_norm, self.eps), layer.gate_up, layer.gate_up_bias)
            gated = self.act(gate_up[..., : self.intermediate]) * gate_up[..., self.intermediate :]
            hidden = hidden + F.linear(gated, layer.down, layer.down_bias)
        return hidden

    def head(self, hidden: Tensor) -> Tensor:
        """The final norm and the LM head: the logits, in the model's dtype."""
        return F.linear(F.rms_norm(hidden, (hidden.shape[-1],), self.norm, self.eps), self.lm_head)
