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

An MoE layer's routed experts are Megatron MLPs of their own (`experts.local_experts.E.linear_fc1`):
`experts.linear_fc1` / `experts.linear_fc2` give each of them an adapter like the above, split over
the expert tensor-parallel group (the linear's own `tp_group`) and, under expert parallel, held by
the rank that holds the expert (its gradient reduced as the expert's, `allreduce = False`).

At init B is zero (the model is the base model); A is Kaiming-uniform as PEFT's, drawn on the
full shape from a generator seeded by the run's seed and the layer's whole-model name, then cut,
so every tensor- and expert-parallel degree starts alike.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn
from torch.distributed import ProcessGroup

from slimeish.common import peft_experts
from slimeish.trainer.config import LORA_HF_EXPERT_PARAMS, LORA_HF_MODULES, LoraSpec
from slimeish.trainer.convert import gather_shards, qkv_from_megatron
from slimeish.trainer.expert_parallel import gather_experts, global_names, is_expert_param
from slimeish.trainer.model import ModelShape

# Whether each target splits its output (column) or its input (row) over tensor-parallel ranks.
TARGETS = {"linear_qkv": "column", "linear_fc1": "column", "linear_proj": "row", "linear_fc2": "row"}
TARGETS |= {expert: TARGETS[expert.removeprefix("experts.")] for expert in LORA_HF_EXPERT_PARAMS}


class LoraAdapter(nn.Module):
    """This rank's A `[r, in_local]` and B `[out_local, r]` of one linear layer."""

    def __init__(self, a: Tensor, out_features: int, spec: LoraSpec, parallel: str, group):
        super().__init__()
        self.A = nn.Parameter(a)
        self.B = nn.Parameter(a.new_zeros(out_features, spec.rank))
        self.scale, self.parallel = spec.scale, parallel
        self.group = group  # the linear's tensor-parallel group (an expert's: the expert tensor-parallel one)
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
            h = copy_to_tensor_model_parallel_region(h, group=self.group)
        else:
            h = reduce_from_tensor_model_parallel_region(h, group=self.group)
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
    model.requires_grad_(False)
    targeted = dict(_targeted(model, spec.targets))
    whole_model = global_names(model, list(targeted))
    for name, linear in targeted.items():
        weight = linear.weight
        assert isinstance(weight, Tensor)
        parallel = TARGETS[target_name(name)]
        group = cast(ProcessGroup, linear.tp_group)  # Megatron's linears carry their own TP group
        rank, world = group.rank(), group.size()
        in_full = weight.shape[1] * (world if parallel == "row" else 1)
        gen = torch.Generator().manual_seed(seed * 100_003 + zlib.crc32(whole_model[name].encode()))
        a = torch.empty(spec.rank, in_full)
        bound = 1 / math.sqrt(in_full)  # kaiming_uniform_(a=sqrt(5)), as nn.Linear and PEFT
        a.uniform_(-bound, bound, generator=gen)
        if parallel == "row":
            a = a.chunk(world, dim=1)[rank]
        a = a.to(device=weight.device, dtype=weight.dtype).contiguous()
        linear.lora = LoraAdapter(a, weight.shape[0], spec, parallel, group)
        for p in linear.lora.parameters():  # reduced over data parallel as the base weight (EP: an expert's own)
            p.allreduce = getattr(weight, "allreduce", True)  # type: ignore[attr-defined]
        linear.register_forward_hook(_add_lora_output)
    if not targeted:
        raise ValueError(f"--lora-target-modules {list(spec.targets)} matched no layer of the model")


def target_name(module: str) -> str:
    """The `--lora-target-modules` name of a linear layer: a routed expert's gets `experts.`."""
    last = module.rsplit(".", 1)[-1]
    return "experts." + last if is_expert_param(module + ".") else last


def _targeted(model: nn.Module, targets: tuple[str, ...]) -> Iterator[tuple[str, nn.Module]]:
    for name, module in model.named_modules():
        if hasattr(module, "weight") and target_name(name) in targets:
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
    """Every adapter's full (tensor-parallel gathered) A and B on CPU, by whole-model Megatron layer
    name (under expert parallel, every rank's experts: a collective over the expert-parallel group)."""
    own: dict[str, Tensor] = {}
    for name, ad in adapters(model):
        a, b = ad.A.detach(), ad.B.detach()
        world = ad.group.size()
        if world > 1:  # the split one is cut as the base weight is: gather it as the base weight
            split = b if ad.parallel == "column" else a
            pieces = [torch.empty_like(split) for _ in range(world)]
            torch.distributed.all_gather(pieces, split.contiguous(), group=ad.group)
            full = gather_shards(name + ".weight", pieces)
            a, b = (a, full) if ad.parallel == "column" else (full, b)
        own[name + ".A"], own[name + ".B"] = a, b
    every = gather_experts(own, model)
    names = sorted({k.rsplit(".", 1)[0] for k in every})
    return {n: (every[n + ".A"].to("cpu", copy=True), every[n + ".B"].to("cpu", copy=True)) for n in names}


def _hf_path(path: str) -> str:
    """A Megatron module path as HF's (`decoder.layers.1.self_attention` -> `model.layers.1.self_attn`)."""
    return path.replace("decoder.layers.", "model.layers.", 1).replace(".self_attention", ".self_attn")


def _dense_peft(name: str, a: Tensor, b: Tensor, shape: ModelShape) -> dict[str, Tensor]:
    """One linear layer's adapter as PEFT's: a fused layer's becomes one adapter per HF module with
    the same A and B's rows for that module (B @ A splits by rows exactly)."""
    path, kind = name.rsplit(".", 1)
    if kind == "linear_qkv":
        bs: tuple[Tensor, ...] = tuple(qkv_from_megatron(b, shape))
    elif kind == "linear_fc1":
        bs = tuple(t.contiguous() for t in b.chunk(2))
    else:
        bs = (b,)
    out = {}
    for module, b_part in zip(LORA_HF_MODULES[kind], bs, strict=True):
        prefix = f"base_model.model.{_hf_path(path)}.{module}"
        out[prefix + ".lora_A.weight"] = a.clone()  # one copy per module: safetensors stores no aliases
        out[prefix + ".lora_B.weight"] = b_part.contiguous()
    return out


def _experts_peft(experts: str, per_target: dict[str, dict[int, tuple[Tensor, Tensor]]]) -> dict[str, Tensor]:
    """One MoE layer's routed experts' adapters (`experts`: Megatron's `...mlp.experts`; target ->
    expert index -> (A, B)) as PEFT's on the fused parameters. Megatron's fc1 is [gate; up] as
    HF's `gate_up_proj`, so B's rows carry over."""
    params = {t: LORA_HF_EXPERT_PARAMS[t].rsplit(".", 1)[-1] for t in per_target}
    paths = peft_experts.key_paths(list(params.values()))
    out = {}
    for target, per_expert in per_target.items():
        lora_a, lora_b = peft_experts.to_peft(*peft_experts.stack([per_expert[e] for e in sorted(per_expert)]))
        prefix = ".".join(filter(None, ["base_model.model." + _hf_path(experts), paths[params[target]]]))
        out[prefix + ".lora_A.weight"], out[prefix + ".lora_B.weight"] = lora_a, lora_b
    return out


def peft_state_dict(full: dict[str, tuple[Tensor, Tensor]], shape: ModelShape) -> dict[str, Tensor]:
    """Megatron-named adapters (`full_adapter_weights`) -> PEFT's keys on the HF model."""
    out: dict[str, Tensor] = {}
    experts: dict[str, dict[str, dict[int, tuple[Tensor, Tensor]]]] = {}  # ...mlp.experts -> target -> expert
    for name, (a, b) in full.items():
        if not is_expert_param(name + "."):
            out.update(_dense_peft(name, a, b, shape))
            continue
        layer, expert = name.split(".local_experts.", 1)
        experts.setdefault(layer, {}).setdefault(target_name(name), {})[int(expert.split(".", 1)[0])] = (a, b)
    for layer, per_target in experts.items():
        out.update(_experts_peft(layer, per_target))
    return out


def peft_config(spec: LoraSpec, base_model: str, tensors: dict[str, Tensor]) -> dict:
    """adapter_config.json as PEFT writes it for a LoRA on a causal LM. `target_modules` names only
    the modules `tensors` adapt: on an MoE model PEFT (0.21, transformers 5) takes a gate/up/down_proj
    there for the fused routed experts. Routed experts' adapters are on `target_parameters`, for
    which PEFT refuses dropout (a served adapter uses none anyway)."""
    modules = [m for m in spec.hf_target_modules() if any(f".{m}.lora_A." in k for k in tensors)]
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0 if spec.hf_target_parameters() else spec.dropout,
        "target_modules": modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "inference_mode": True,
    } | ({"target_parameters": spec.hf_target_parameters()} if spec.hf_target_parameters() else {})


def write_peft_adapter(out_dir: Path, tensors: dict[str, Tensor], config: dict) -> Path:
    """adapter_config.json and adapter_model.safetensors, PEFT's file names."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=1))
    save_file(tensors, out_dir / "adapter_model.safetensors", metadata={"format": "pt"})
    return out_dir
