"""Policy-gradient losses, KL penalties, entropy and importance weights on [batch, tokens] tensors.

Pure torch, independent of Megatron, so each piece is checked against hand-worked numbers.
Every function takes per-token tensors of the response part, right-padded, with `mask` 1 on the
tokens that are trained on; formulas are in docs/losses.md.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from slimeish.trainer.config import LossConfig


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def ppo_clip_loss(
    ratio: Tensor, advantages: Tensor, eps_clip: float, eps_clip_high: float, dual_clip_c: float | None
) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate, per token: max(-A r, -A clip(r, 1-eps, 1+eps_high)).

    `eps_clip_high` > `eps_clip` is DAPO's clip-higher (room for low-probability tokens to grow).
    Dual clip (Ye et al. 2020) additionally bounds the loss by -c A when A < 0, so a huge ratio on
    a negative-advantage token cannot blow up the update. Returns (loss, clipped indicator).
    """
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - eps_clip, 1 + eps_clip_high)
    loss = torch.maximum(unclipped, clipped)
    is_clipped = (clipped > unclipped).float()
    if dual_clip_c is not None:
        bound = -advantages * dual_clip_c
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        is_clipped = torch.where(dual, torch.ones_like(is_clipped), is_clipped)
    return loss, is_clipped


def gspo_log_ratio(log_probs: Tensor, old_log_probs: Tensor, mask: Tensor) -> Tensor:
    """GSPO: per-token log ratio whose value is the sequence's mean log ratio, log s_i, and whose
    gradient is that of log pi(y_t) (s_i = exp(mean_t log(pi/pi_old)); GSPO paper, eq. 7)."""
    seq = ((log_probs - old_log_probs) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return seq.detach().unsqueeze(-1) + log_probs - log_probs.detach()


def cispo_loss(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, eps_clip: float, eps_clip_high: float
) -> tuple[Tensor, Tensor]:
    """CISPO (MiniMax-M1): -sg(clip(r, 1-eps, 1+eps_high)) * A * log pi. The importance weight is
    clipped and detached, so every token keeps a gradient (PPO drops clipped tokens')."""
    ratio = (log_probs - old_log_probs).exp()
    weight = ratio.clamp(1 - eps_clip, 1 + eps_clip_high).detach()
    is_clipped = (weight != ratio.detach()).float()
    return -weight * advantages * log_probs, is_clipped


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, kind: str) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1/k2/k3).

    k1 = log r', k2 = (log r')^2 / 2, k3 = exp(-log r') - 1 + log r' with log r' = log pi - log pi_ref;
    k3 is unbiased and never negative (the "low-var" estimator of GRPO).
    """
    log_ratio = log_probs - ref_log_probs
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind in ("k3", "low_var_kl"):
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown kl estimator {kind!r}; expected k1, k2 or k3")


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax over the last dim: -sum p log p."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def rollout_log_ratio(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, level: str) -> Tensor:
    """log rho = log pi_old - log pi_roll per token (token level), or the sum of it over each row's
    trained tokens, given to every token of the row (sequence level: rho = prod_t rho_t)."""
    log_ratio = (old_log_probs - rollout_log_probs) * mask
    if level == "token":
        return log_ratio
    if level == "sequence":
        return log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    raise ValueError(f"unknown importance-sampling level {level!r}; expected 'token' or 'sequence'")


def importance_weights(log_ratio: Tensor, low: float, high: float, mode: str) -> tuple[Tensor, Tensor]:
    """Off-policy weights from log rho, detached, and where they differ from rho (1.0, else 0.0).

    truncate (TIS): w = clamp(rho, low, high). mask (MIS, IcePop): w = rho inside [low, high], 0
    outside, so a token the engine sampled from far other numbers carries no gradient at all.
    Computed in log space: a sequence's product of ratios overflows float32 long before it matters.
    """
    log_ratio = log_ratio.detach()
    log_low, log_high = (math.log(low) if low > 0 else -math.inf), math.log(high)
    inside = (log_ratio >= log_low) & (log_ratio <= log_high)
    if mode == "truncate":
        weights = log_ratio.clamp(log_low, log_high).exp()
    elif mode == "mask":
        weights = torch.where(inside, log_ratio.exp(), torch.zeros_like(log_ratio))
    else:
        raise ValueError(f"unknown importance-sampling mode {mode!r}; expected 'truncate' or 'mask'")
    return weights, (~inside).float()


def off_policy_correction(
    cfg: LossConfig, old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """The per-token weights of `cfg`'s correction (TIS, MIS or IcePop) and the fraction of trained
    tokens they clip (`is_clip_fraction`, truncate) or mask (`is_mask_fraction`)."""
    correction = cfg.correction()
    assert correction is not None  # the trainer only calls this with a correction selected
    mode, level, low, high = correction
    log_ratio = rollout_log_ratio(old_log_probs, rollout_log_probs, mask, level)
    weights, changed = importance_weights(log_ratio, low, high, mode)
    name = "is_clip_fraction" if mode == "truncate" else "is_mask_fraction"
    return weights, {name: masked_mean(changed, mask)}


def aggregate(per_token: Tensor, mask: Tensor, mode: str, normalizer: float) -> Tensor:
    """Reduce per-token losses to a scalar share of the global batch's loss.

    token: sum over all trained tokens / `normalizer` (= trained tokens in the global batch), so
    every token weighs the same (DAPO). sequence: each sequence's token mean, summed, / `normalizer`
    (= sequences in the global batch), so every sequence weighs the same (GRPO).
    """
    if mode == "token":
        return (per_token * mask).sum() / normalizer
    if mode == "sequence":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / normalizer
    raise ValueError(f"unknown loss aggregation {mode!r}; expected 'token' or 'sequence'")


def opd_advantages(
    advantages: Tensor, student_log_probs: Tensor, teacher_log_probs: Tensor, coef: float
) -> tuple[Tensor, Tensor]:
    """On-policy distillation as slime applies it: the per-token reverse KL estimate
    log pi(y_t) - log pi_teacher(y_t), detached, lowers each token's advantage by `coef` times it,
    so the policy gradient pushes the student's log-prob towards the teacher's. Returns the new
    advantages and the reverse KL (for logging)."""
    reverse_kl = (student_log_probs - teacher_log_probs).detach()
    return advantages - coef * reverse_kl, reverse_kl


def sft_loss(log_probs: Tensor) -> Tensor:
    """Per-token negative log-likelihood (slime's `sft_loss`): the trained tokens are targets, so
    neither advantages nor the engine's log-probs take part."""
    return -log_probs


def policy_loss(
    cfg: LossConfig, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token loss of `cfg.loss_type`: the policy-gradient loss of `cfg.policy_loss`, with its
    diagnostics (clip fraction, PPO KL), or the SFT loss."""
    if cfg.loss_type == "sft_loss":
        return sft_loss(log_probs), {}
    eps_high = cfg.eps_clip if cfg.eps_clip_high is None else cfg.eps_clip_high
    if cfg.policy_loss == "cispo":
        loss, is_clipped = cispo_loss(log_probs, old_log_probs, advantages, cfg.eps_clip, eps_high)
    else:
        log_ratio = log_probs - old_log_probs
        if cfg.policy_loss == "gspo":
            log_ratio = gspo_log_ratio(log_probs, old_log_probs, mask)
        loss, is_clipped = ppo_clip_loss(log_ratio.exp(), advantages, cfg.eps_clip, eps_high, cfg.dual_clip_c)
    stats = {
        "clip_fraction": masked_mean(is_clipped, mask).detach(),
        "ppo_kl": masked_mean(old_log_probs - log_probs, mask).detach(),
    }
    return loss, stats
