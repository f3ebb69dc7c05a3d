"""Batched sampling: temperature, top-k, top-p and greedy per row, plus the logprob the trainer recomputes.

Randomness is one uniform number per row per step, drawn from that sequence's own `random.Random`
(seeded by `sampling_seed`), and turned into a token by inverting the row's CDF. A sequence's
tokens therefore depend only on its seed and its logits, not on what else shares the batch.

The returned logprob is `log_softmax(raw logits)[token]`: the model's distribution at temperature 1
with no top-k/top-p filtering, which is what the trainer computes from the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# SGLang's convention: a temperature this small means greedy decoding.
GREEDY_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class RowSampling:
    temperature: float
    top_p: float
    top_k: int  # <= 0 or >= vocab: no top-k


def sample(logits: torch.Tensor, rows: list[RowSampling], uniforms: list[float]) -> tuple[list[int], list[float]]:
    """Pick one token per row of `logits` (`[n, vocab]`, float32); return tokens and their logprobs."""
    logprobs = torch.log_softmax(logits, dim=-1)
    vocab = logits.shape[-1]
    greedy = [r.temperature < GREEDY_EPS for r in rows]
    if all(greedy):
        tokens = logits.argmax(dim=-1)
    else:
        temps = [1.0 if g else r.temperature for r, g in zip(rows, greedy, strict=True)]
        scaled = logits  # x / 1.0 is x exactly: the usual all-at-temperature-1 batch skips the division
        if any(t != 1.0 for t in temps):
            scaled = logits / torch.tensor(temps, device=logits.device)[:, None]
        tokens = _sample_scaled(scaled, rows, uniforms, vocab)
        if any(greedy):
            tokens = torch.where(torch.tensor(greedy, device=logits.device), logits.argmax(dim=-1), tokens)
    chosen = logprobs.gather(1, tokens[:, None])[:, 0]
    return tokens.tolist(), chosen.tolist()


def _sample_scaled(scaled: torch.Tensor, rows: list[RowSampling], uniforms: list[float], vocab: int) -> torch.Tensor:
    u = torch.tensor(uniforms, dtype=scaled.dtype, device=scaled.device)[:, None]
    if all(r.top_p >= 1.0 and not 0 < r.top_k < vocab for r in rows):
        return _invert_cdf(torch.softmax(scaled, dim=-1), u)
    # Filtering works on the sorted distribution: keep the top-k and the smallest prefix reaching top-p.
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    ks = torch.tensor([r.top_k if 0 < r.top_k < vocab else vocab for r in rows], device=scaled.device)
    ps = torch.tensor([r.top_p for r in rows], dtype=probs.dtype, device=scaled.device)
    rank = torch.arange(vocab, device=scaled.device)[None, :]
    drop = (rank >= ks[:, None]) | (probs.cumsum(dim=-1) - probs > ps[:, None])
    picked = _invert_cdf(probs.masked_fill(drop, 0.0), u)
    return order.gather(1, picked[:, None])[:, 0]


def _invert_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    cdf = probs.cumsum(dim=-1)
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)[:, 0]
    # Clamp guards against u * total rounding to exactly the last cumulative value; then step back
    # over zero-probability entries (filtered tokens) so a filtered token is never picked.
    idx = idx.clamp(max=probs.shape[-1] - 1)
    zero = probs.gather(1, idx[:, None])[:, 0] <= 0
    if zero.any():
        last_nonzero = (probs > 0).cumsum(dim=-1).argmax(dim=-1)
        idx = torch.where(zero, last_nonzero, idx)
    return idx
