"""slime's `slime.backends.megatron_utils.cp_utils` at a context-parallel size of 1 (slimeish has no
context parallelism): every rank holds whole sequences, so gathering and slicing a sequence's
per-token values are the identity, and `get_sum_of_sample_mean` is the trainer's reduction."""

from __future__ import annotations

from torch import Tensor

from slimeish.trainer.loss_hooks import get_sum_of_sample_mean


def all_gather_with_cp(tensor: Tensor, total_length: int, response_length: int) -> Tensor:
    """A sample's per-token values over its whole response: this rank's already."""
    return tensor


def slice_log_prob_with_cp(log_prob: Tensor, total_length: int, response_length: int) -> Tensor:
    """This rank's part of a sample's per-token values: all of them."""
    return log_prob


__all__ = ["all_gather_with_cp", "get_sum_of_sample_mean", "slice_log_prob_with_cp"]
