"""PEFT's layout of LoRA on a Mixture-of-Experts layer's fused expert parameters.

transformers (v5) holds a layer's routed experts as two 3-D parameters of one module,
`experts.gate_up_proj` `[E, 2I, H]` and `experts.down_proj` `[E, H, I]`; PEFT (0.17+) adapts them
with `target_parameters` (`lora.ParamWrapper`), one low-rank pair per expert stored as one pair:
`lora_A` `[E * r, in]` (expert-major rows) and `lora_B` `[out, r * E]` (column `j * E + e` is
expert e's j-th). Two targeted parameters of one module nest their wrappers in the module's
parameter order, the first innermost, so its keys gain one `.base_layer` per wrapper outside it.
Both the trainer's export and the engine's reader use this module, so they agree by construction.
"""

from __future__ import annotations

import torch
from torch import Tensor

FUSED_EXPERT_PARAMS = ("gate_up_proj", "down_proj")  # transformers' order in the experts module


def key_paths(targeted: list[str]) -> dict[str, str]:
    """For the targeted fused parameters, each one's module path in PEFT's keys relative to the
    experts module: `{"gate_up_proj": "base_layer", "down_proj": ""}` when both are targeted."""
    ordered = [p for p in FUSED_EXPERT_PARAMS if p in targeted]
    return {p: ".".join(["base_layer"] * (len(ordered) - 1 - i)) for i, p in enumerate(ordered)}


def targeted_params(target_parameters: list[str]) -> list[str]:
    """Which fused parameters an adapter_config's `target_parameters` names (`mlp.experts.down_proj`, ...)."""
    return [p for p in FUSED_EXPERT_PARAMS if any(t.rsplit(".", 1)[-1] == p for t in target_parameters)]


def to_peft(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Per-expert `A [E, r, in]`, `B [E, out, r]` -> PEFT's `lora_A [E r, in]`, `lora_B [out, r E]`."""
    experts, rank, _ = a.shape
    return a.reshape(experts * rank, -1).contiguous(), b.permute(1, 2, 0).reshape(b.shape[1], -1).contiguous()


def from_peft(lora_a: Tensor, lora_b: Tensor, experts: int) -> tuple[Tensor, Tensor]:
    """Inverse of `to_peft`."""
    a = lora_a.reshape(experts, -1, lora_a.shape[-1])
    b = lora_b.reshape(lora_b.shape[0], -1, experts).permute(2, 0, 1)
    return a.contiguous(), b.contiguous()


def stack(pairs: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """One (A, B) per expert, in expert order -> `A [E, r, in]`, `B [E, out, r]`."""
    return torch.stack([a for a, _ in pairs]), torch.stack([b for _, b in pairs])
