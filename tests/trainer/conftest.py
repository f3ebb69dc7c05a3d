"""Trainer test fixtures: one Megatron initialisation per process, engines on free ports."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

from slimeish.common.procs import ManagedProcess, free_port, wait_http
from slimeish.trainer.distributed import init_distributed


@pytest.fixture(scope="session", autouse=True)
def _megatron_cpu():
    """Megatron's parallel state is process-global: initialise it once (gloo, world of one)."""
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    init_distributed(use_gpu=False)


@pytest.fixture(scope="module")
def engine_factory(tmp_path_factory):
    """Start `slimeish engine --model DIR` on a free port; returns its base URL. Stopped at teardown."""
    procs: list[ManagedProcess] = []

    def start(model_dir) -> str:
        port = free_port()
        log = tmp_path_factory.mktemp("engine") / "engine.log"
        proc = ManagedProcess.slimeish("engine", "--model", str(model_dir), "--port", str(port), log_path=log)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=120, proc=proc.proc)
        return url

    yield start
    for p in procs:
        p.stop()


def tiny_qwen3_moe(out: Path, router_aux_loss_coef: float) -> Path:
    """A tiny Qwen3-MoE (4 experts, 2 layers) saved in `out`."""
    config = Qwen3MoeConfig(vocab_size=300, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                            router_aux_loss_coef=router_aux_loss_coef, max_position_embeddings=512,
                            tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim >= 2:
                p.normal_(std=0.2)  # larger than the default init: experts and routes differ visibly
    hf.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory) -> Path:
    """The tiny Qwen3-MoE without the load-balancing loss (the routing-replay and MoE LoRA tests')."""
    return tiny_qwen3_moe(tmp_path_factory.mktemp("qwen3_moe"), router_aux_loss_coef=0.0)
