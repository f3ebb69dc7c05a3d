"""GPU checks run in a fresh process (NCCL + CUDA), so they never share Megatron's global state
with the CPU tests. Prints one JSON line of measurements; `test_gpu.py` asserts on them."""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM

from slimeish.common.sample import Sample
from slimeish.trainer.config import LossConfig, TrainerConfig
from slimeish.trainer.convert import megatron_to_hf
from slimeish.trainer.hf_io import megatron_params, read_hf_weights
from slimeish.trainer.model import build_gpt_model, gpt_logits
from slimeish.trainer.trainer import Trainer
from tests.trainer.trainer_helpers import load_hf_into


def main(model_dir: str) -> None:
    trainer = Trainer(TrainerConfig(model_path=model_dir, device="cuda", dtype="bfloat16", lr=1e-3), LossConfig())
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    fp32 = build_gpt_model(trainer.hf_config, use_gpu=True).eval()
    ref = read_hf_weights(model_dir)
    load_hf_into(fp32, ref, trainer.shape)
    back = megatron_to_hf(megatron_params(fp32), trainer.shape)
    exact = all(torch.equal(back[k].cpu(), ref[k]) for k in back)
    ids = torch.randint(0, trainer.shape.vocab_size, (2, 32), device="cuda")
    with torch.no_grad():
        diff32 = (gpt_logits(fp32, ids, trainer.shape.vocab_size) - hf(ids).logits).abs().max().item()
        diff16 = (gpt_logits(trainer.model, ids, trainer.shape.vocab_size) - hf(ids).logits).abs().max().item()
    samples = [
        Sample(group_index=g, index=i, tokens=ids[g].tolist(), response_length=8, loss_mask=[1] * 8, reward=float(i))
        for g in range(2)
        for i in range(2)
    ]
    metrics = trainer.train_step(samples)
    print(json.dumps({"round_trip_exact": exact, "fp32_logits_diff": diff32, "bf16_logits_diff": diff16,
                      "metrics": metrics}))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
