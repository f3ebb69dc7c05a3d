"""Pack samples into right-padded micro-batches bounded by a token budget.

A micro-batch costs (number of sequences) x (longest sequence) tokens once padded; samples are
sorted longest first and packed greedily, so sequences of similar length share a micro-batch.
Tensors cover the response part: position j of row i is response token j of sample i, predicted
by the logits at prompt_length - 1 + j.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from slimeish.common.routed_experts import decode_routed_experts
from slimeish.common.sample import Sample


@dataclass(kw_only=True, slots=True)
class MicroBatch:
    indices: list[int]  # positions of these rows in the caller's sample list
    input_ids: Tensor  # [b, L] prompt + response, right-padded with 0
    response_start: Tensor  # [b] index of the logit that predicts the first response token
    response_lengths: Tensor  # [b] response tokens of each row (the rest of its R positions are padding)
    loss_mask: Tensor  # [b, R] float, 0 on padding and on tokens the model did not sample
    rollout_log_probs: Tensor  # [b, R] engine log-probs (0 where missing)
    advantages: Tensor  # [b, R] the sample's advantage on every response position
    has_rollout: Tensor  # [b] bool, whether the sample carries rollout_log_probs
    teacher_log_probs: Tensor  # [b, R] an OPD teacher's log-probs of the response tokens (0 where missing)
    # [b, L, moe_layers * top_k] the engine's expert ids per token (-1 where not recorded); None: no sample has them
    routed_experts: Tensor | None = None

    def to(self, device: torch.device) -> MicroBatch:
        routes = None if self.routed_experts is None else self.routed_experts.to(device)
        tensors = {k: getattr(self, k).to(device) for k in _TENSORS}
        return MicroBatch(indices=self.indices, routed_experts=routes, **tensors)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())


_TENSORS = (
    "input_ids", "response_start", "response_lengths", "loss_mask", "rollout_log_probs", "advantages",
    "has_rollout", "teacher_log_probs",
)  # fmt: skip


def validate_samples(samples: Sequence[Sample]) -> None:
    for s in samples:
        s.validate()
        if s.response_length < 1 or s.prompt_length < 1:
            raise ValueError(f"sample {s.session_id or s.index}: needs >= 1 prompt token and >= 1 response token")


def pack_micro_batches(
    samples: Sequence[Sample], max_tokens: int, advantages: Tensor | None = None
) -> list[MicroBatch]:
    """Greedy packing, longest first; a sample longer than `max_tokens` gets a micro-batch alone."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].tokens), reverse=True)
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * len(samples[groups[-1][0]].tokens) <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    adv = advantages if advantages is not None else torch.zeros(len(samples))
    return [_collate([samples[i] for i in g], g, adv[g]) for g in groups]


def _collate(samples: list[Sample], indices: list[int], advantages: Tensor) -> MicroBatch:
    b = len(samples)
    seq_len = max(len(s.tokens) for s in samples)
    resp_len = max(s.response_length for s in samples)
    input_ids = torch.zeros(b, seq_len, dtype=torch.long)
    mask = torch.zeros(b, resp_len)
    rollout = torch.zeros(b, resp_len)
    teacher = torch.zeros(b, resp_len)
    for row, s in enumerate(samples):
        input_ids[row, : len(s.tokens)] = torch.tensor(s.tokens)
        r = s.response_length
        mask[row, :r] = torch.tensor(s.loss_mask if s.loss_mask is not None else [1] * r, dtype=torch.float32)
        if s.rollout_log_probs is not None:
            rollout[row, :r] = torch.tensor(s.rollout_log_probs, dtype=torch.float32)
        if s.teacher_log_probs is not None:
            teacher[row, :r] = torch.as_tensor(s.teacher_log_probs, dtype=torch.float32)
    starts = torch.tensor([s.prompt_length - 1 for s in samples])
    return MicroBatch(
        indices=indices,
        input_ids=input_ids,
        response_start=starts,
        response_lengths=torch.tensor([s.response_length for s in samples]),
        loss_mask=mask,
        rollout_log_probs=rollout,
        advantages=_per_token(advantages.float(), resp_len),
        has_rollout=torch.tensor([s.rollout_log_probs is not None for s in samples]),
        teacher_log_probs=teacher,
        routed_experts=_routes(samples, seq_len),
    )


def _routes(samples: list[Sample], seq_len: int) -> Tensor | None:
    """The samples' recorded routes, right-padded with -1 (the token none was recorded for, the
    last one, gets -1 too: its routing only shapes the logits after the sequence)."""
    if all(s.rollout_routed_experts is None for s in samples):
        return None
    rows = [
        None if s.rollout_routed_experts is None else decode_routed_experts(s.rollout_routed_experts, len(s.tokens) - 1)
        for s in samples
    ]
    widths = {r.shape[1] for r in rows if r is not None}
    if len(widths) != 1:
        raise ValueError(f"samples carry routed experts of different widths {sorted(widths)} (layers x top-k)")
    out = torch.full((len(samples), seq_len, widths.pop()), -1, dtype=torch.long)
    for row, r in enumerate(rows):
        if r is not None:
            out[row, : len(r)] = r
    return out


def _per_token(advantages: Tensor, resp_len: int) -> Tensor:
    """[b, R]: a per-sample advantage on every response position, or per-token ones cut to R."""
    if advantages.ndim == 2:
        return advantages[:, :resp_len].clone()
    return advantages.unsqueeze(-1).expand(len(advantages), resp_len).clone()


def response_positions(mb: MicroBatch, seq_len: int) -> Tensor:
    """[b, R] index of the logit that predicts each response token (clamped inside the row; the
    positions past a sample's response are padding, masked out by `loss_mask`)."""
    resp_len = mb.loss_mask.shape[1]
    idx = mb.response_start.unsqueeze(-1) + torch.arange(resp_len, device=mb.response_start.device)
    return idx.clamp(max=seq_len - 2)


def split_global_batches(samples: Sequence[Sample], global_batch_size: int | None) -> list[list[int]]:
    """Indices of the samples of each optimizer step."""
    n = len(samples)
    size = global_batch_size or n
    if n % size:
        raise ValueError(f"{n} samples is not a multiple of global_batch_size={size}")
    return [list(range(k, k + size)) for k in range(0, n, size)]


def idle_micro_batch() -> MicroBatch:
    """One two-token row that trains nothing (loss mask 0): under expert parallel a rank with fewer
    micro-batches than the others runs it, since every MoE forward and backward is a collective."""
    zeros = torch.zeros(1, 1)
    return MicroBatch(
        indices=[],
        input_ids=torch.zeros(1, 2, dtype=torch.long),
        response_start=torch.zeros(1, dtype=torch.long),
        response_lengths=torch.ones(1, dtype=torch.long),
        loss_mask=zeros,
        rollout_log_probs=zeros,
        advantages=zeros,
        has_rollout=torch.zeros(1, dtype=torch.bool),
        teacher_log_probs=zeros,
    )
