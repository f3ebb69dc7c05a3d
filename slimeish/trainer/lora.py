"""LoRA adapters on Megatron's tensor-parallel linear layers (base weights frozen).

Each targeted `ColumnParallelLinear` / `RowParallelLinear` keeps its own forward and gets a
`LoraAdapter` submodule (`<layer>.lora.A`, `<layer>.lora.B`) plus a forward hook that adds
`scale * B(A(dropout(x)))` to the layer's output, so base parameter names, the HF conversion and
Megatron's own kernels stay as they are. Tensor parallel follows the base weight's split:

* column-parallel (`linear_qkv`, `linear_fc1`: output split): A `[r, in]` is replicated, B
  `[out / tp, r]` is split like W's rows. `A x` is the same on every rank; its gradient sums the
  ranks' B shards, so it enters the tensor-parallel region (backward all-reduce) after A.
* row-parallel (`linear_proj`, `linear_fc2`: input split): A `[r, in / tp]` is split like W's
  columns, B `[out, r]` is replicated. `A x` is a partial sum over ranks: all-reduced before B.

At init B is zero (the model is the base model); A is Kaiming-uniform as PEFT's, drawn on the
full shape from a seeded generator and then cut, so every tensor-parallel degree starts alike.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn

from slimeish.trainer.config import LORA_HF_MODULES, LoraSpec
from slimeish.trainer.convert import gather_shards, qkv_from_megatron
from slimeish.trainer.model import ModelShape

# Whether each target splits its output (column) or its input (row) over tensor-parallel ranks.
TARGETS = {"linear_qkv": "column", "linear_fc1": "column", "linear_proj": "row", "linear_fc2": "row"}


class LoraAdapter(nn.Module):
    """This rank's A `[r, in_local]` and B `[out_local, r]` of one linear layer."""

    def __init__(self, a: Tensor, out_features: int, spec: LoraSpec, parallel: str):
        super().__init__()
        self.A = nn.Parameter(a)
        self.B = nn.Parameter(a.new_zeros(out_features, spec.rank))
        self.scale, self.parallel = spec.scale, parallel
        self.enabled = True  # off: the layer is the frozen base (a LoRA run's KL reference)
        self.dropout = nn.Dropout(spec.dropout) if spec.dropout else nn.Identity()
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        # Megatron counts a split parameter once per rank in the gradient norm, a replicated one once.
        split = self.B if parallel == "column" else self.A
        set_tensor_model_parallel_attributes(split, True, 0 if parallel == "column" else 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        from megatron.core.tensor_parallel.mappings import (
            copy_to_tensor_model_parallel_region,
            reduce_from_tensor_model_parallel_region,
        )

        h = self.dropout(x) @ self.A.t()
        if self.parallel == "column":
            h = copy_to_tensor_model_parallel_region(h)
        else:
            h = reduce_from_tensor_model_parallel_region(h)
        return (h @ self.B.t()) * self.scale


def _add_lora_output(module: nn.Module, args: tuple, output: tuple[Tensor, Tensor | None]):
    out, bias = output
    adapter = module.lora
    assert isinstance(adapter, LoraAdapter)
    return (out + adapter(args[0]) if adapter.enabled else out), bias


@contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """Within the block `model` is its frozen base: a LoRA run's KL reference, with no second copy."""
    found = [ad for _, ad in adapters(model)]
    for ad in found:
        ad.enabled = False
    try:
        yield
    finally:
        for ad in found:
            ad.enabled = True


def attach_lora(model: nn.Module, spec: LoraSpec, seed: int) -> None:
    """Freeze `model` and give each targeted linear layer an adapter (call before the optimizer is built)."""
    from megatron.core import parallel_state

    model.requires_grad_(False)
    rank, world = parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size()
    for i, (name, linear) in enumerate(list(_targeted(model, spec.targets))):
        weight = linear.weight
        assert isinstance(weight, Tensor)
        parallel = TARGETS[name.rsplit(".", 1)[-1]]
        in_full = weight.shape[1] * (world if parallel == "row" else 1)
        gen = torch.Generator().manual_seed(seed * 100_003 + i)
        a = torch.empty(spec.rank, in_full)
        bound = 1 / math.sqrt(in_full)  # kaiming_uniform_(a=sqrt(5)), as nn.Linear and PEFT
        a.uniform_(-bound, bound, generator=gen)
        if parallel == "row":
            a = a.chunk(world, dim=1)[rank]
        a = a.to(device=weight.device, dtype=weight.dtype).contiguous()
        linear.lora = LoraAdapter(a, weight.shape[0], spec, parallel)
        linear.register_forward_hook(_add_lora_output)
    if not any(True for _ in adapters(model)):
        raise ValueError(f"--lora-target-modules {list(spec.targets)} matched no layer of the model")


def _targeted(model: nn.Module, targets: tuple[str, ...]) -> Iterator[tuple[str, nn.Module]]:
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in targets and hasattr(module, "weight"):
            yield name, module


def adapters(model: nn.Module) -> Iterator[tuple[str, LoraAdapter]]:
    """(name of the linear layer, its adapter), in model order."""
    for name, module in model.named_modules():
        if isinstance(module, LoraAdapter):
            yield name.removesuffix(".lora"), module


def is_lora_param(name: str) -> bool:
    return ".lora." in name


def with_merged_adapters(params: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """`params` (this rank's base weights by Megatron name) with each adapter's `scale * B @ A`
    added: the delta has the same shape and split as the weight's shard, so it adds locally."""
    merged = dict(params)
    for name, ad in adapters(model):
        merged[name + ".weight"] = params[name + ".weight"] + (ad.B @ ad.A).detach() * ad.scale
    return merged


def full_adapter_weights(model: nn.Module) -> dict[str, tuple[Tensor, Tensor]]:
    """Every adapter's full (tensor-parallel gathered) A and B on CPU, by Megatron layer name."""
    from megatron.core import parallel_state

    world = parallel_state.get_tensor_model_parallel_world_size()
    out = {}
    for name, ad in adapters(model):
        a, b = ad.A.detach(), ad.B.detach()
        if world > 1:  # the split one is cut as the base weight is: gather it as the base weight
            split = b if ad.parallel == "column" else a
            pieces = [torch.empty_like(split) for _ in range(world)]
            group = parallel_state.get_tensor_model_parallel_group()
            torch.distributed.all_gather(pieces, split.contiguous(), group=group)
            full = gather_shards(name + ".weight", pieces)
            a, b = (a, full) if ad.parallel == "column" else (full, b)
        out[name] = (a.to("cpu", copy=True), b.to("cpu", copy=True))
    return out


def peft_state_dict(full: dict[str, tuple[Tensor, Tensor]], shape: ModelShape) -> dict[str, Tensor]:
    """Megatron-named adapters -> PEFT's keys on the HF model. A fused layer's adapter becomes one
    adapter per HF module with the same A and B's rows for that module: B @ A splits by rows exactly."""
    out: dict[str, Tensor] = {}
    for name, (a, b) in full.items():
        layer = int(name.split("decoder.layers.", 1)[1].split(".", 1)[0])
        kind = name.rsplit(".", 1)[-1]
        block = "self_attn" if kind in ("linear_qkv", "linear_proj") else "mlp"
        if kind == "linear_qkv":
            bs: tuple[Tensor, ...] = tuple(qkv_from_megatron(b, shape))
        elif kind == "linear_fc1":
            bs = tuple(t.contiguous() for t in b.chunk(2))
        else:
            bs = (b,)
        for module, b_part in zip(LORA_HF_MODULES[kind], bs, strict=True):
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            out[prefix + ".lora_A.weight"] = a.clone()  # one copy per module: safetensors stores no aliases
            out[prefix + ".lora_B.weight"] = b_part.contiguous()
    return out


def peft_config(spec: LoraSpec, base_model: str) -> dict:
    """adapter_config.json as PEFT writes it for a LoRA on a causal LM."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": spec.hf_target_modules(),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "inference_mode": True,
    }


def write_peft_adapter(out_dir: Path, tensors: dict[str, Tensor], config: dict) -> Path:
    """adapter_config.json and adapter_model.safetensors, PEFT's file names."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=1))
    save_file(tensors, out_dir / "adapter_model.safetensors", metadata={"format": "pt"})
    return out_dir
