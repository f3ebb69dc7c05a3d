"""Attention for the embedded engine's forwards: a prefill chunk without a mask.

A forward of one sequence's prompt chunk needs no mask at all: every key before the chunk is
visible to every query, and within the chunk the visibility is the plain causal triangle. So
attention runs as two kernels, merged exactly through their log-sum-exps: the chunk's queries
against the keys before it (no mask), and against the chunk's own keys (`is_causal`, which skips
the blocks above the diagonal). With an additive mask `[chunk, kv_len]` the same step built the
mask (~20 % of a cached turn's prefill in a profile: fill, compare, masked_fill over chunk x
kv_len floats) and the kernel read it in every layer and head; without it a 1,504-token chunk
after 28,800 cached tokens took half the time (0.55 s against 1.2 s a layer, one thread).

The split kernel is PyTorch's CPU flash attention, which returns the log-sum-exp. Decode steps
(their mask is one row per sequence, cheaper than the split's extra small ops: c=1 throughput fell
~10 % with them split too) keep the additive mask; on CPU they run as two batched matmuls over the
decode view's rows (`_masked_cpu`, `decode_view`), and every forward on other devices takes
Hugging Face's SDPA path. A decode step with whole prompts riding along (`MixedStep`) runs each
part as it would alone: the decode rows as above, each prompt as its own first chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

ATTN_IMPLEMENTATION = "slimeish_paged"


@dataclass(frozen=True, slots=True)
class ChunkSpan:
    """Passed to the layers as their `attention_mask` for prefill chunks sharing their start: in
    each row the queries are positions `start .. end-1`, and the keys they see are positions
    `0 .. end-1` (several prompts' first chunks, right-padded to one width: a query sees none of
    the padding after it)."""

    start: int
    end: int


@dataclass(slots=True)
class MixedStep:
    """Passed to the layers as their `attention_mask` for a decode step with whole prompts riding
    along, all packed in one row: first one token per decoding sequence (the decode view's rows
    `0 .. decode-1`, `mask` their additive `[decode, 1, 1, kv_len]` mask), then each prompt from
    position 0 at `spans[i]` (`[a, b)` in the row). The cache's `update` hands back the row's new
    K/V as they are (a prompt sees only its own) and puts the decode rows' K/V, `[decode,
    kv_heads, kv_len, dim]`, in `rows`. One forward instead of two: for a small model a forward's
    fixed cost (the layers' Python) is most of a short prompt's prefill."""

    decode: int
    mask: torch.Tensor
    spans: list[tuple[int, int]]
    rows: tuple[torch.Tensor, torch.Tensor] | None = None


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | ChunkSpan | MixedStep | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """HF's attention-interface signature: `query` `[n, heads, width, dim]`, `key`/`value`
    `[n, kv_heads, kv_len, dim]` (`value` may be narrower); returns `[n, width, heads, v_dim]`."""
    if isinstance(attention_mask, MixedStep):
        return _mixed(module, query, key, value, attention_mask, scaling), None
    if isinstance(attention_mask, torch.Tensor) and query.device.type == "cpu":
        return _masked_cpu(query, key, value, attention_mask, scaling), None
    if not isinstance(attention_mask, ChunkSpan):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    v_dim = value.shape[-1]
    assert v_dim <= key.shape[-1], "values wider than keys: no model has them"
    if v_dim < key.shape[-1]:
        # the CPU flash kernel wants one head size for Q, K and V; MLA's values are narrower. Zero
        # columns added to V add zero columns to the output, sliced off: exact.
        value = torch.nn.functional.pad(value, (0, key.shape[-1] - v_dim))
    start, end = attention_mask.start, attention_mask.end
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    groups = query.shape[1] // key.shape[1]
    # within the chunk: causal, queries and keys both the chunk (top-left aligned is right here)
    out, lse = flash(query, repeat_kv(key[:, :, start:end], groups), repeat_kv(value[:, :, start:end], groups),
                     0.0, True, scale=scaling)[:2]  # fmt: skip
    if start > 0:
        # before the chunk: all visible. The query heads sharing a KV head are stacked as one
        # longer query sequence, so the (long) cached keys are read as they are, not repeated.
        n, heads, width, dim = query.shape
        stacked = query.reshape(n, heads // groups, groups * width, dim)
        past, past_lse = flash(stacked, key[:, :, :start], value[:, :, :start], 0.0, False, scale=scaling)[:2]
        past, past_lse = past.reshape(n, heads, width, -1), past_lse.reshape(n, heads, width)
        total = torch.logaddexp(lse, past_lse)
        out = out * (lse - total).exp()[..., None] + past * (past_lse - total).exp()[..., None]
    # the log-sum-exps are float32: a half-precision model's output must keep its own dtype
    return out[..., :v_dim].to(query.dtype).transpose(1, 2), None


def _mixed(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, step: MixedStep,
    scaling: float | None,
) -> torch.Tensor:  # fmt: skip
    """`MixedStep`'s attention: the decode rows as a decode step's, each prompt as its own first chunk."""
    assert step.rows is not None, "the cache's update fills the decode rows"
    d = step.decode
    # [1, heads, d, dim] -> [d, heads, 1, dim]; the output [d, 1, heads, v_dim] -> [1, d, heads, v_dim]
    outs = [_masked_cpu(query[:, :, :d].transpose(0, 2), *step.rows, step.mask, scaling).transpose(0, 1)]
    for a, b in step.spans:
        span = ChunkSpan(0, b - a)
        outs.append(
            paged_attention(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], span, scaling=scaling)[0]
        )
    return torch.cat(outs, dim=1)


def _masked_cpu(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    """Attention with an additive mask `[n, 1, width, kv_len]` as two batched matmuls, the query
    heads that share a KV head stacked as one query block. `key`/`value` are read where they lie:
    rows of the decode view (`[n, kv_heads, ...]` underneath) or a page gather's transposed view
    of `[kv_heads, n, ...]` (`PagedKV.update`); the batch dims are taken in that order, so
    neither is copied. CPU SDPA took ~3x as long for a decode step's shapes (one query row per
    sequence, a mask), and its GQA path repeats the keys first. The scores are one `baddbmm`,
    scale and mask applied inside it: apart, the two were ~25 % of a c=64 decode step's attention."""
    dtype = query.dtype
    if dtype != torch.float32:  # scores and softmax in float32, as a half-precision model's would be upcast
        query, key, value, mask = query.float(), key.float(), value.float(), mask.float()
    n, heads, width, dim = query.shape
    kv_heads, kv_len, v_dim = key.shape[1], key.shape[2], value.shape[-1]
    groups = heads // kv_heads
    q = query.reshape(n, kv_heads, groups * width, dim)
    bias = mask.view(n, 1, 1, width, kv_len)
    head_major = n > 1 and key.stride(0) < key.stride(1)  # batch dims (kv_heads, n)
    if head_major:
        q, key, value, bias = q.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), bias.transpose(0, 1)
    a, b = q.shape[:2]
    bias = bias.expand(a, b, groups, width, kv_len).reshape(a * b, groups * width, kv_len)
    scores = torch.baddbmm(bias, q.reshape(a * b, groups * width, dim), key.reshape(a * b, kv_len, dim).transpose(1, 2),
                           alpha=scaling or dim**-0.5)  # fmt: skip
    out = torch.bmm(scores.softmax(-1), value.reshape(a * b, kv_len, v_dim)).view(a, b, groups * width, v_dim)
    if head_major:
        out = out.transpose(0, 1)
    return out.reshape(n, heads, width, v_dim).transpose(1, 2).to(dtype)


AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention)
