"""Per-token log-probs and entropy of the response part of a micro-batch."""

from __future__ import annotations

import torch
from torch import Tensor

from slimeish.trainer.batching import MicroBatch, response_positions
from slimeish.trainer.model import gpt_logits


def response_log_probs(model: torch.nn.Module, mb: MicroBatch, vocab_size: int) -> tuple[Tensor, Tensor]:
    """(log pi(token), entropy of pi) at every response position, [b, R] each, fp32.

    log-softmax of the raw logits (temperature 1), as the engines report them. Only the response
    positions' logits are kept before the fp32 softmax, so long prompts cost no vocab-sized
    activations. The entropy keeps its graph, so an entropy bonus can backpropagate through it.
    """
    logits = gpt_logits(model, mb.input_ids, vocab_size)  # [b, L, V]
    pos = response_positions(mb, mb.input_ids.shape[1])  # [b, R]
    picked = logits.gather(1, pos.unsqueeze(-1).expand(-1, -1, logits.shape[-1])).float()
    log_p = torch.log_softmax(picked, dim=-1)
    targets = mb.input_ids.gather(1, pos + 1)
    token_log_p = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return token_log_p, entropy
