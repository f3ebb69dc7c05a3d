"""Expert parallel (EP > 1) on CPU ranks: a gloo token dispatcher, expert names and gradients.

Each rank holds `num_experts / EP` experts (Megatron's `local_experts.0..`); the dense weights are
replicated and data parallel. Megatron's all-gather dispatcher is the one that fits gloo: all-to-all
(`MoEAlltoAllTokenDispatcher`) builds a CUDA stream when constructed and syncs CUDA events per
forward, while all-gather needs only a gather of the ranks' tokens and a reduce-scatter of the
experts' outputs. Megatron's own gather and reduce-scatter allocate their outputs on
`torch.cuda.current_device()` and need every rank to hold the same number of tokens, so
`HostAllGatherTokenDispatcher` does both with gloo's all-gather and all-reduce on host tensors,
row counts exchanged first (the ranks' micro-batches differ in shape).

Every MoE forward is a collective over the EP group, so each rank must run as many forwards and
backwards as the others (`align_micro_batch_count`).
"""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher
from torch import Tensor

# A routed expert's parameter (shared experts are dense: replicated on every rank).
_LOCAL_EXPERT = re.compile(r"(\.experts\.local_experts\.)(\d+)(\.)")


def is_expert_param(name: str) -> bool:
    return _LOCAL_EXPERT.search(name) is not None


def ep_rank_and_size() -> tuple[int, int]:
    from megatron.core import parallel_state

    return parallel_state.get_expert_model_parallel_rank(), parallel_state.get_expert_model_parallel_world_size()


def global_expert_name(name: str, num_local: int, ep_rank: int) -> str:
    """`...local_experts.<local index>...` -> the same name with the expert's index in the whole model."""
    return _LOCAL_EXPERT.sub(lambda m: f"{m[1]}{ep_rank * num_local + int(m[2])}{m[3]}", name)


def local_expert_index(name: str, num_local: int) -> tuple[int, str]:
    """(the EP rank that holds it, its local name) of a whole-model expert parameter name."""
    m = _LOCAL_EXPERT.search(name)
    assert m is not None, name
    rank, local = divmod(int(m[2]), num_local)
    return rank, name[: m.start(2)] + str(local) + name[m.end(2) :]


def _row_counts(rows: int, group: dist.ProcessGroup) -> list[int]:
    counts = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size(group))]
    dist.all_gather(counts, torch.tensor([rows]), group=group)
    return [int(c) for c in counts]


def _gather_rows(x: Tensor, counts: list[int], group: dist.ProcessGroup) -> Tensor:
    """Every rank's rows of `x`, in rank order (padded to the longest for gloo's equal-size all-gather)."""
    most = max(counts)
    padded = x.new_zeros(most, *x.shape[1:])
    padded[: x.shape[0]] = x
    pieces = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(pieces, padded.contiguous(), group=group)
    return torch.cat([p[:n] for p, n in zip(pieces, counts, strict=True)])


def _own_rows(full: Tensor, counts: list[int], group: dist.ProcessGroup) -> Tensor:
    start = sum(counts[: dist.get_rank(group)])
    return full[start : start + counts[dist.get_rank(group)]]


class _GatherRows(torch.autograd.Function):
    """Forward: all ranks' rows. Backward: the summed gradients of this rank's rows (a reduce-scatter)."""

    @staticmethod
    def forward(ctx, x: Tensor, counts: list[int], group: dist.ProcessGroup) -> Tensor:
        ctx.counts, ctx.group = counts, group
        return _gather_rows(x, counts, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return _own_rows(grad, ctx.counts, ctx.group), None, None


class _ReduceScatterRows(torch.autograd.Function):
    """Forward: the sum over ranks of this rank's rows. Backward: every rank's rows' gradients (a gather)."""

    @staticmethod
    def forward(ctx, x: Tensor, counts: list[int], group: dist.ProcessGroup) -> Tensor:
        ctx.counts, ctx.group = counts, group
        summed = x.contiguous().clone()
        dist.all_reduce(summed, group=group)
        return _own_rows(summed, counts, group).clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _gather_rows(grad.contiguous(), ctx.counts, ctx.group), None, None


class HostAllGatherTokenDispatcher(MoEAllGatherTokenDispatcher):
    """Megatron's all-gather dispatcher with its two collectives on host tensors over gloo (see the
    module docstring); permutation, expert compute and unpermutation are Megatron's."""

    def token_dispatch(self, hidden_states: Tensor, probs: Tensor) -> tuple[Tensor, Tensor]:
        group = self.tp_ep_group
        self._counts = _row_counts(hidden_states.shape[0], group)
        with torch.no_grad():  # gloo has no bool all-gather
            routes: Tensor = self.routing_map  # type: ignore[has-type]  # set by dispatch_preprocess
            self.routing_map = _gather_rows(routes.to(torch.uint8), self._counts, group).bool()
        probs = _GatherRows.apply(probs, self._counts, group)
        return _GatherRows.apply(hidden_states, self._counts, group), probs

    def token_combine(self, hidden_states: Tensor) -> Tensor:
        out = _ReduceScatterRows.apply(hidden_states.to(self.local_probs.dtype), self._counts, self.tp_ep_group)
        return out.to(hidden_states.dtype)


def align_micro_batch_count(count: int, device: torch.device) -> int:
    """The most micro-batches any rank has this step: every rank runs that many forwards and backwards."""
    most = torch.tensor([count], device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return int(most.item())


def _local_count(model: torch.nn.Module, ep_size: int) -> int:
    experts: int = model.config.num_moe_experts  # type: ignore[union-attr,assignment]
    return experts // ep_size


def global_names(model: torch.nn.Module, names: list[str]) -> dict[str, str]:
    """Each of this rank's parameter names -> its name in the whole model (experts renumbered)."""
    rank, size = ep_rank_and_size()
    if size == 1:
        return {n: n for n in names}
    local = _local_count(model, size)
    return {n: global_expert_name(n, local, rank) if is_expert_param(n) else n for n in names}


def held_elsewhere(name: str, model: torch.nn.Module) -> bool:
    """Whether a whole-model parameter name is an expert another EP rank holds."""
    rank, size = ep_rank_and_size()
    return size > 1 and is_expert_param(name) and local_expert_index(name, _local_count(model, size))[0] != rank


def gather_experts(own: dict[str, Tensor], model: torch.nn.Module) -> dict[str, Tensor]:
    """This rank's weights with every EP rank's experts added under their whole-model names (a collective;
    every rank holds the same local names, so all walk them in the same order)."""
    from megatron.core import parallel_state

    size = ep_rank_and_size()[1]
    if size == 1:
        return own
    local, group = _local_count(model, size), parallel_state.get_expert_model_parallel_group()
    out = {n: t for n, t in own.items() if not is_expert_param(n)}
    for name in sorted(n for n in own if is_expert_param(n)):
        pieces = [torch.empty_like(own[name]) for _ in range(size)]
        dist.all_gather(pieces, own[name].contiguous(), group=group)
        out.update({global_expert_name(name, local, r): p for r, p in enumerate(pieces)})
    return out


def expert_parallel_grad_norm(params: list[torch.nn.Parameter]) -> Tensor:
    """The whole model's gradient L2 norm: the replicated weights' once, plus every EP rank's experts."""
    from megatron.core import parallel_state

    def norm(grads: list[Tensor]) -> Tensor:
        return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())

    dense = norm([p.grad for p in params if p.grad is not None and getattr(p, "allreduce", True)])
    experts_sq = norm([p.grad for p in params if p.grad is not None and not getattr(p, "allreduce", True)]) ** 2
    dist.all_reduce(experts_sq, group=parallel_state.get_expert_model_parallel_group())
    return (dense**2 + experts_sq).sqrt()


def mark_expert_parallel(model: torch.nn.Module, use_gpu: bool) -> None:
    """Routed experts' weights are this rank's own: `allreduce = False` (Megatron's mark, which its
    DDP and optimizer read) keeps their gradients off the data-parallel all-reduce. On CPU each MoE
    layer dispatches tokens over gloo (`HostAllGatherTokenDispatcher`)."""
    for name, param in model.named_parameters():
        if is_expert_param(name):
            param.allreduce = False  # type: ignore[attr-defined]
    if not use_gpu:
        for layer in model.decoder.layers:  # type: ignore[union-attr]
            if hasattr(layer.mlp, "token_dispatcher"):
                layer.mlp.token_dispatcher.__class__ = HostAllGatherTokenDispatcher  # instance-local, as the router's
