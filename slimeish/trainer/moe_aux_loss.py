"""The MoE load-balancing (aux) loss over one optimizer step: its gradient's scale and its metric.

Megatron adds the aux loss's gradient in backward through `MoEAuxLossAutoScaler`, with a scale set
from outside, and keeps each layer's loss in a process-wide tracker; the trainer sets the one and
reads the other around a step's real micro-batches.
"""

from __future__ import annotations

import torch


def start_moe_step(micro_batches: int, device: torch.device) -> None:
    """Zero Megatron's aux-loss tracker and scale the aux loss's gradient for one optimizer step.

    Megatron adds the load-balancing loss's gradient in backward, once per micro-batch; the scale
    1 / `micro_batches` (the step's micro-batches on all data-parallel ranks, whose gradients are
    summed) makes it the mean over the step, as the policy loss is (each micro-batch's policy loss
    is already its share of the global batch)."""
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler, clear_aux_losses_tracker

    clear_aux_losses_tracker()
    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(1.0 / max(micro_batches, 1), device=device))


def stop_moe_aux_loss(device: torch.device) -> float:
    """This rank's load-balancing loss of the step so far (before its coefficient), summed over MoE
    layers and micro-batches, and no aux-loss gradient from here on: expert parallel's idle
    micro-batches, which only pair up collectives, train nothing and count in no metric."""
    from megatron.core.transformer.moe.moe_utils import (
        MoEAuxLossAutoScaler,
        clear_aux_losses_tracker,
        get_moe_layer_wise_logging_tracker,
    )

    tracked = get_moe_layer_wise_logging_tracker().get("load_balancing_loss")
    total = 0.0 if tracked is None else tracked["values"].sum().item()  # None: trained without one (GLM-4.5)
    clear_aux_losses_tracker()
    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(0.0, device=device))
    return total
