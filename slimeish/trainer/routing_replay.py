"""Routing replay (R3): the trainer's MoE layers route each token to the experts the engine chose.

Every MoE router gets a `RoutingReplay` as its `router_replay`, the hook Megatron's
`topk_routing_with_score_function` calls for the top-k step. With recorded routes for the
micro-batch, it compares the trainer's own top-k with the engine's (the routing-mismatch metric,
replay on or off) and, with replay on, hands back the engine's expert ids with the trainer's
scores at those ids (Megatron turns them into the routing weights: softmax, or sigmoid renormalised
and scaled, of the trainer's own router), so the router still gets its gradient. Tokens without a record (padding,
a sample's last token, samples without routes) keep the trainer's own choice.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from slimeish.trainer.model import moe_routers

TopK = Callable[..., tuple[Tensor, Tensor]]


class RoutingReplay:
    """One MoE layer's replay state (duck-types Megatron's `RouterReplay.get_replay_topk`)."""

    def __init__(self, replay: bool):
        self.replay = replay
        self.target: Tensor | None = None  # [tokens, top_k] in Megatron's (s, b) token order; -1 rows: none
        self.compared = self.differed = 0  # (token, layer) pairs recorded; of those, own top-k != engine's

    def get_replay_topk(
        self, scores: Tensor, topk: int, num_groups: int | None, group_topk: int | None, default_compute_topk: TopK
    ) -> tuple[Tensor, Tensor]:
        values, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        if self.target is None:
            return values, own
        target = self.target.to(own.device)
        recorded = target[:, 0] >= 0
        same = (own.sort(dim=-1).values == target.sort(dim=-1).values).all(dim=-1)
        self.compared += int(recorded.sum())
        self.differed += int((recorded & ~same).sum())
        if not self.replay:
            return values, own
        chosen = torch.where(recorded.unsqueeze(-1), target, own)
        return scores.gather(1, chosen), chosen


class ModelRouting:
    """The replay states of one model's MoE layers (dense layers have no router), set per micro-batch."""

    def __init__(self, model: torch.nn.Module, *, replay: bool):
        routers = moe_routers(model)
        self.layers = [RoutingReplay(replay) for _ in routers]
        for router, state in zip(routers, self.layers, strict=True):
            router.router_replay = state

    def set_routes(self, routes: Tensor | None) -> None:
        """`routes`: `[b, s, moe_layers * top_k]` (-1 where not recorded) for the next forward, or None."""
        for j, state in enumerate(self.layers):
            if routes is None:
                state.target = None
                continue
            per_layer = routes.reshape(*routes.shape[:2], len(self.layers), -1)[:, :, j]  # [b, s, k]
            state.target = per_layer.transpose(0, 1).reshape(-1, per_layer.shape[-1])  # Megatron's [s * b, k]

    def take_mismatch(self) -> dict[str, float]:
        """Since the last call, over the (token, layer) pairs the engine recorded: the fraction whose
        trainer top-k differs from the engine's (`routing_mismatch_own`), and the fraction routed
        differently in the forward that was used (`routing_mismatch`: 0 with replay). Resets."""
        compared = sum(s.compared for s in self.layers)
        differed = sum(s.differed for s in self.layers)
        for s in self.layers:
            s.compared = s.differed = 0
        if not compared:
            return {}
        own = differed / compared
        return {"routing_mismatch_own": own, "routing_mismatch": 0.0 if self.layers[0].replay else own}
