"""Optimizer and learning-rate schedule.

CPU: `torch.optim.AdamW` (Megatron's optimizers allocate their buffers on CUDA). GPU: Megatron's
optimizer over a Megatron DDP-wrapped model (fp32 master weights for bf16). The GPU path
all-reduces gradients and keeps full optimizer state per rank (no distributed optimizer), so
`state_dict()` / `load_state_dict()` checkpoint it like a torch optimizer. The schedule writes
`lr` into the param groups itself, so it drives either optimizer.
"""

from __future__ import annotations

import math

import torch

from slimeish.trainer.config import TrainerConfig


def lr_at(step: int, cfg: TrainerConfig) -> float:
    """Linear warm-up to `lr` over `lr_warmup_steps`, then constant / linear / cosine to `min_lr`."""
    if step < cfg.lr_warmup_steps:
        return cfg.lr * (step + 1) / cfg.lr_warmup_steps
    if cfg.lr_decay_style == "constant":
        return cfg.lr
    if not cfg.lr_decay_steps:  # `slimeish train` sets them; a Trainer built directly must
        raise ValueError(f"lr_decay_style={cfg.lr_decay_style!r} needs lr_decay_steps")
    progress = min(1.0, (step - cfg.lr_warmup_steps) / cfg.lr_decay_steps)
    if cfg.lr_decay_style == "linear":
        return cfg.lr + (cfg.min_lr - cfg.lr) * progress
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def build_cpu_optimizer(model: torch.nn.Module, cfg: TrainerConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=lr_at(0, cfg),
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
    )


def wrap_gpu_model(model: torch.nn.Module):
    """Megatron DDP: bucketed gradient all-reduce over the data-parallel group, fp32 grad buffers."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=False)
    return DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model)


def build_gpu_optimizer(ddp_model, cfg: TrainerConfig):
    """Megatron's AdamW with gradient clipping (fp32 master weights when the model is bf16)."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=lr_at(0, cfg),
        min_lr=cfg.min_lr,
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.adam_beta1,
        adam_beta2=cfg.adam_beta2,
        adam_eps=cfg.adam_eps,
        clip_grad=cfg.clip_grad,
        bf16=cfg.dtype == "bfloat16",
        params_dtype=torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32,
        use_distributed_optimizer=False,
    )
    return get_megatron_optimizer(opt_config, [ddp_model])
