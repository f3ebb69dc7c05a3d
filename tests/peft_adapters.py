"""Real PEFT LoRA adapter directories for a tiny model, written with `peft` itself (no trainer)."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM


def write_peft_adapter(model_dir: Path, out: Path, seed: int) -> str:
    """A rank-2 adapter on q_proj and v_proj, B drawn from `seed` (nonzero, so seeds differ); its path."""
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    peft_model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(generator=torch.Generator().manual_seed(seed))
    peft_model.save_pretrained(out)
    return str(out)
