"""Per-token log-probs and entropy of the response part of a micro-batch."""

from __future__ import annotations

import torch
from torch import Tensor

from slimeish.trainer.batching import MicroBatch, response_values
from slimeish.trainer.model import gpt_logits


def response_log_probs(model: torch.nn.Module, mb: MicroBatch, vocab_size: int) -> tuple[Tensor, Tensor]:
    """(log pi(token), entropy of pi) at every response position, [b, R] each, fp32.

    log-softmax of the raw logits (temperature 1), as the engines report them. The entropy
    keeps its graph, so an entropy bonus can backpropagate through it.
    """
    logits = gpt_logits(model, mb.input_ids, vocab_size)[:, :-1]
    log_p = torch.log_softmax(logits, dim=-1)
    token_log_p = log_p.gather(-1, mb.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return response_values(token_log_p, mb), response_values(entropy, mb)
