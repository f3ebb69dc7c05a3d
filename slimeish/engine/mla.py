"""Multi-head latent attention (DeepSeek-V3's MLA) in the embedded engine: what its KV cache holds.

Hugging Face's `DeepseekV3Attention` hands its cache the two latents of each token, not per-head
K and V: the normalised kv latent (`kv_lora_rank` wide) and the rotated, shared key part
(`qk_rope_head_dim` wide), each as one head. It expands them to per-head keys
(`qk_nope_head_dim + qk_rope_head_dim`) and values (`v_head_dim`) through `kv_b_proj` after
reading the cache. `PagedKV` stores the two latents in its key and value pools as they come, so
the forward is HF's own, op for op (exact), and a token costs `kv_lora_rank + qk_rope_head_dim`
values per layer (V3: 576) instead of `heads x (k + v)` (V3: 128 x 320). The price is that every
forward expands the whole visible context again (one `kv_b_proj` matmul per layer), which the
"absorbed" form of MLA avoids at the cost of a different summation order than HF's.

The expanded values are narrower than the keys (V3: 128 against 192); `attention.paged_attention`
takes care of that for the CPU flash kernel.
"""

from __future__ import annotations

MLA_TYPES = ("deepseek_v3",)


def latent_shapes(config) -> tuple[tuple[int, int], tuple[int, int]]:
    """`([heads, dim], [heads, dim])` of the cached "key" (the kv latent) and "value" (the rotated
    shared key part) per token and layer, as HF's attention passes them to the cache."""
    return (1, config.kv_lora_rank), (1, config.qk_rope_head_dim)
