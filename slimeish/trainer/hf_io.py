"""Read Hugging Face weights into a Megatron model and write Megatron weights as a HF checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from slimeish.trainer.convert import gather_shards, megatron_to_hf, shard_for_rank
from slimeish.trainer.expert_parallel import gather_experts, global_names, held_elsewhere
from slimeish.trainer.lora import is_lora_param, with_merged_adapters
from slimeish.trainer.model import ModelShape

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".safetensors.index.json", ".bin.index.json")


def read_hf_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no *.safetensors weights found")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(f))
    return weights


def _tp_rank_and_size() -> tuple[int, int]:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size()


def megatron_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Base parameters by Megatron name, without Transformer-Engine style `_extra_state` entries
    or LoRA adapters."""
    return {
        k: v
        for k, v in model.state_dict().items()
        if "_extra_state" not in k and not is_lora_param(k) and isinstance(v, torch.Tensor)
    }


def load_megatron_into(model: torch.nn.Module, full: dict[str, torch.Tensor]) -> None:
    """Copy already converted (full, Megatron-named) weights into `model`, this rank's shard of each
    (under expert parallel, its own experts)."""
    rank, world = _tp_rank_and_size()
    own = megatron_params(model)
    names = global_names(model, list(own))
    missing = sorted(set(names.values()) - set(full))
    extra = sorted(n for n in set(full) - set(names.values()) if not held_elsewhere(n, model))
    if missing or extra:
        raise ValueError(f"weight names differ: missing {missing}, extra {extra}")
    with torch.no_grad():
        for name, param in own.items():
            param.copy_(shard_for_rank(name, full[names[name]], rank, world))


def gather_hf_state_dict(model: torch.nn.Module, shape: ModelShape) -> dict[str, torch.Tensor]:
    """Full HF-named weights on CPU, gathered over the tensor-parallel group when TP > 1 and the
    experts over the expert-parallel group when EP > 1; LoRA adapters, if any, merged into their base weights."""
    _, world = _tp_rank_and_size()
    own = with_merged_adapters(megatron_params(model), model)
    if world > 1:
        from megatron.core import parallel_state

        group = parallel_state.get_tensor_model_parallel_group()
        full = {}
        for name, t in own.items():
            pieces = [torch.empty_like(t) for _ in range(world)]
            torch.distributed.all_gather(pieces, t.contiguous(), group=group)
            full[name] = gather_shards(name, pieces)
        own = full
    own = gather_experts(own, model)
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in megatron_to_hf(own, shape).items()}


def write_hf_checkpoint(state: dict[str, torch.Tensor], out_dir: Path, source_dir: Path) -> Path:
    """config.json, tokenizer and generation files copied from `source_dir`, weights as one safetensors."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in Path(source_dir).iterdir():
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES):
            shutil.copy2(f, out_dir / f.name)
    save_file(state, out_dir / "model.safetensors", metadata={"format": "pt"})
    return out_dir
