"""GPU variants (CUDA, NCCL, Megatron optimizer, bf16); skipped cleanly without CUDA.

bf16 tolerance: the tiny models' logits are O(0.1); bf16 keeps ~3 significant digits, so the
bf16 policy's logits must match the fp32 HF model's within 2e-2 absolute. fp32 on GPU keeps the
CPU bound of 1e-4 (TF32 matmuls are off by default in torch).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_gpu_bridge_and_bf16_step(tiny_model_factory, arch):
    # a module of the tests package, run from the repository root so it imports the test helpers
    command = [sys.executable, "-m", "tests.trainer.gpu_check", str(tiny_model_factory(arch))]
    out = subprocess.run(command, cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=600,
                         check=True)  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["round_trip_exact"]
    assert result["fp32_logits_diff"] <= 1e-4
    assert result["bf16_logits_diff"] <= 2e-2
    assert all(v == v for v in result["metrics"].values())  # no NaN
    assert result["metrics"]["weight_version"] == 1
