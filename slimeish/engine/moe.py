"""Mixture-of-Experts support in the embedded engine: expert weights by checkpoint name, and the
routing each token took (for routing replay).

transformers (v5) holds a layer's experts fused, `mlp.experts.gate_up_proj` `[E, 2I, H]` and
`mlp.experts.down_proj` `[E, H, I]`, while published checkpoints and the trainer's export name
them per expert (`mlp.experts.{e}.gate_proj.weight`, ...). `expert_target` maps one per-expert
tensor onto its slice of the fused parameter, so weight updates keep the checkpoint's names.

`RouteRecorder` hooks each sparse layer's router (HF computes the scores and top-k there: Qwen3-MoE's
softmax, GLM-4.5's and DeepSeek-V3's sigmoid plus score-correction bias, group-limited; dense
layers, GLM-4.5's and DeepSeek-V3's first, have none) and
writes the top-k expert ids of every token it runs into a per-KV-slot table, next to the token's
K/V: a prefix-cache hit then brings back the routing the cached tokens had when they were run,
as SGLang's capturer does.

`experts_with_lora` runs the experts as transformers' eager forward does, with a LoRA adapter's
per-expert delta added to each expert's gate/up and down projections (unmerged).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

_EXPERT_NAME = re.compile(r"^(?P<prefix>.+\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


def expert_target(name: str, params: dict[str, Tensor]) -> Tensor | None:
    """The slice of a fused expert parameter that the per-expert tensor `name` fills (None: not one)."""
    m = _EXPERT_NAME.match(name)
    if m is None:
        return None
    prefix, e, proj = m["prefix"], int(m["e"]), m["proj"]
    if proj == "down_proj":
        fused = params.get(prefix + ".down_proj")
        return None if fused is None or e >= fused.shape[0] else fused[e]
    fused = params.get(prefix + ".gate_up_proj")
    if fused is None or e >= fused.shape[0]:
        return None
    gate, up = fused[e].chunk(2)  # HF's fused layout: [gate; up] rows
    return gate if proj == "gate_proj" else up


# A fused parameter's name (`gate_up_proj`, `down_proj`) -> per-expert A `[E, r, in]`, B `[E, out, r]`
ExpertLora = dict[str, tuple[Tensor, Tensor]]


def experts_with_lora(
    experts: torch.nn.Module, x: Tensor, top_k_index: Tensor, top_k_weights: Tensor, lora: ExpertLora, scale: float
) -> Tensor:
    """transformers' experts forward on `x` `[n, hidden]` (top-k experts and weights per token) with
    `scale * B_e A_e` added to expert e's targeted projections, as the trainer's adapters add it."""
    weights: dict[str, Tensor] = {p: getattr(experts, p) for p in ("gate_up_proj", "down_proj")}

    def project(h: Tensor, param: str, e: int) -> Tensor:
        out = F.linear(h, weights[param][e])
        if param in lora:
            a, b = lora[param]
            out = out + F.linear(F.linear(h, a[e]), b[e]) * scale
        return out

    act = cast(Callable[[Tensor], Tensor], experts.act_fn)
    final = torch.zeros_like(x)
    for e in top_k_index.unique().tolist():
        if e >= weights["down_proj"].shape[0]:  # transformers' "no expert" index
            continue
        tok, k = torch.where(top_k_index == e)
        gate, up = project(x[tok], "gate_up_proj", e).chunk(2, dim=-1)
        out = project(act(gate) * up, "down_proj", e) * top_k_weights[tok, k, None]
        final.index_add_(0, tok, out.to(final.dtype))
    return final


def moe_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Each sparse layer's router (`mlp.gate`), in layer order; empty for a dense model."""
    layers = model.model.layers  # type: ignore[union-attr]
    return [layer.mlp.gate for layer in layers if hasattr(layer.mlp, "experts")]  # type: ignore[union-attr]


class RouteRecorder:
    """Per KV slot, the top-k expert ids of each sparse layer: `[slots, moe_layers, top_k]` int16."""

    def __init__(self, routers: list[torch.nn.Module], slots: int, top_k: int, device: torch.device):
        self.table = torch.full((slots, len(routers), top_k), -1, dtype=torch.int16, device=device)
        self.write = torch.zeros(0, dtype=torch.long, device=device)
        for j, router in enumerate(routers):
            router.register_forward_hook(self._hook(j))

    def _hook(self, layer: int):
        def record(_module, _inputs, output) -> None:
            # HF routers return (logits, top-k weights, top-k indices) over the flattened tokens,
            # in the same [n, width] order as the slots of this forward (`self.write`).
            self.table[:, layer].index_copy_(0, self.write, output[2].to(torch.int16))

        return record

    def rows(self, slots: Tensor) -> Tensor:
        """`[len(slots), moe_layers, top_k]` int32 for the given slots."""
        return self.table.index_select(0, slots).to(torch.int32)
