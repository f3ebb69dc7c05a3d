"""Process-group set-up for the trainer: gloo on CPU, NCCL on GPUs, then Megatron's parallel state.

Megatron keeps its parallel groups in module globals, so this runs once per process; a second
call with the same sizes is a no-op (tests build several trainers in one process).
"""

from __future__ import annotations

import os
from collections import defaultdict

import torch
import torch.distributed as dist

from slimeish.common.procs import free_port


def init_distributed(
    *, use_gpu: bool, tensor_parallel: int = 1, pipeline_parallel: int = 1, expert_parallel: int = 1, seed: int = 0
) -> None:
    """Join (or create) the default process group and initialise Megatron's model-parallel groups.

    Under `torchrun` the usual RANK / WORLD_SIZE / MASTER_ADDR variables are used; otherwise the
    trainer is a world of one on a free loopback port.
    """
    from megatron.core import parallel_state
    from megatron.core import tensor_parallel as mtp

    if not dist.is_initialized():
        backend = "nccl" if use_gpu else "gloo"
        if "RANK" in os.environ:
            if use_gpu:
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    if parallel_state.model_parallel_is_initialized():
        sizes = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size(),
        )
        if sizes != (tensor_parallel, pipeline_parallel, expert_parallel):
            raise ValueError(f"Megatron already initialised with tp, pp, ep = {sizes} in this process")
    else:
        world = dist.get_world_size()
        if world % (tensor_parallel * pipeline_parallel * expert_parallel):
            raise ValueError(
                f"--expert-model-parallel-size {expert_parallel}: the {world} ranks do not split into groups of "
                f"tensor x pipeline x expert parallel = {tensor_parallel * pipeline_parallel * expert_parallel}"
            )
        parallel_state.initialize_model_parallel(
            tensor_parallel, pipeline_parallel, expert_model_parallel_size=expert_parallel
        )
    torch.manual_seed(seed)
    if use_gpu:
        # Megatron's tracker forks distinct RNG streams for tensor-parallel regions (dropout, init).
        mtp.model_parallel_cuda_manual_seed(seed)


def data_parallel_rank_and_size() -> tuple[int, int]:
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()


def all_reduce_data_parallel(tensors: list[torch.Tensor], *, experts: bool = False) -> None:
    """Sum `tensors` in place over the data-parallel group (one flat all-reduce; a no-op alone).
    `experts`: over the expert-data-parallel group, the ranks that hold the same experts under EP > 1."""
    from megatron.core import parallel_state

    group = parallel_state.get_expert_data_parallel_group() if experts else parallel_state.get_data_parallel_group()
    if not tensors or dist.get_world_size(group) == 1:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    for t, reduced in zip(tensors, flat.split([t.numel() for t in tensors]), strict=True):
        t.copy_(reduced.view_as(t))


def sum_over_data_parallel(sums: dict[str, float]) -> dict[str, float]:
    """A step's per-rank sums (loss, tokens, token-weighted statistics) added up over the data-parallel
    group, so the step's metrics are the whole batch's, not rank 0's share; keys ending in `_max`
    take the maximum. Gathered as objects: a rank whose stripe of the batch was empty has no keys."""
    from megatron.core import parallel_state

    group = parallel_state.get_data_parallel_group()
    if dist.get_world_size(group) == 1:
        return sums
    parts: list[dict[str, float] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, dict(sums), group=group)
    total: dict[str, float] = defaultdict(float)  # as a rank's own sums: a key no rank wrote reads 0
    for part in parts:
        for key, value in (part or {}).items():
            total[key] = max(total.get(key, value), value) if key.endswith("_max") else total.get(key, 0.0) + value
    return total


def global_rank() -> int:
    """This process's rank, 0 when no process group is initialised (a bare CPU run or a test)."""
    return dist.get_rank() if dist.is_initialized() else 0
