"""Bytes moved per weight sync: a LoRA run's adapter against the full model.

Measured: a small model (tests' tiny family, wider) is trained one step, full and with LoRA, and
each pushes its weights to a real embedded engine with `WeightSync` (method `tensor`: files in
shared memory that the engine loads by path); the bytes are those files' sizes, the time the
sync's total (pause, write, load, continue). Computed: the same count for published model
shapes (bf16), with the formula the measured run checks (adapter bytes = the exported tensors).
Run by hand:  .venv/bin/python bench/lora_sync.py [--rank 16]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from pathlib import Path

from slimeish.common.procs import ManagedProcess, free_port, wait_http
from slimeish.models.tiny import TinyModelConfig, make_tiny_model

# (name, hidden, intermediate, layers, heads, kv heads, head dim, vocab, tied embeddings)
PUBLISHED = [
    ("Qwen3-0.6B", 1024, 3072, 28, 16, 8, 128, 151936, True),
    ("Qwen3-8B", 4096, 12288, 36, 32, 8, 128, 151936, False),
    ("Llama-3.1-8B", 4096, 14336, 32, 32, 8, 128, 128256, False),
    ("Qwen3-32B", 5120, 25600, 64, 64, 8, 128, 151936, False),
]


def full_params(h: int, inter: int, layers: int, heads: int, kv: int, d: int, vocab: int, tied: bool) -> int:
    attn = h * heads * d + 2 * h * kv * d + heads * d * h
    per_layer = attn + 3 * h * inter + 2 * h + 2 * d  # norms (incl. qk-norm; a rounding error elsewhere)
    return layers * per_layer + vocab * h * (1 if tied else 2) + h


def adapter_params(h: int, inter: int, layers: int, heads: int, kv: int, d: int, r: int) -> int:
    """PEFT's tensors as `Trainer.export_peft` writes them: one (A, B) per HF module of the four
    Megatron targets (q, k and v share the fused layer's A, stored once per module)."""
    modules = [(h, heads * d), (h, kv * d), (h, kv * d), (heads * d, h), (h, inter), (h, inter), (inter, h)]
    return layers * sum(r * i + o * r for i, o in modules)


def _samples():
    from slimeish.common.sample import Sample

    tokens = [[1, 40, 41, 42, 43, 44], [1, 50, 51, 52, 53, 54]]
    return [Sample(group_index=0, index=i, tokens=t, response_length=3, loss_mask=[1] * 3, reward=float(i))
            for i, t in enumerate(tokens)]  # fmt: skip


def measured(rank: int, work: Path) -> list[tuple[str, int, float]]:
    from slimeish.trainer.config import TrainerConfig
    from slimeish.trainer.distributed import init_distributed
    from slimeish.trainer.trainer import Trainer
    from slimeish.trainer.weight_sync import WeightSync, WeightSyncConfig

    os.environ.setdefault("OMP_NUM_THREADS", "2")
    init_distributed(use_gpu=False)
    cfg = TinyModelConfig(hidden_size=256, intermediate_size=704, num_layers=4, num_heads=8, num_kv_heads=4)
    model = make_tiny_model(work / "model", cfg)
    port = free_port()
    engine = ManagedProcess.slimeish("engine", "--model", str(model), "--port", str(port), log_path=work / "engine.log")
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        wait_http(url + "/health", timeout=300, proc=engine.proc)
        for label, lora_rank in (("full", 0), (f"LoRA r={rank}", rank)):
            trainer = Trainer(TrainerConfig(model_path=model, lr=1e-3, lora_rank=lora_rank))
            trainer.train_step(_samples())
            shm = work / f"shm-{lora_rank}"
            shm.mkdir()
            with WeightSync(WeightSyncConfig(engine_urls=[url], method="tensor", shm_dir=shm)) as sync:
                total = sync.sync(trainer)["total"]
                moved = sum(p.stat().st_size for p in shm.rglob("*") if p.is_file())
            rows.append((label, moved, total))
        head, inter, layers, heads, kv = 256, 704, 4, 8, 4
        expected = 4 * adapter_params(head, inter, layers, heads, kv, head // heads, rank)  # float32
        print(f"check: adapter tensors {expected} B by the formula; the adapter file {rows[1][1]} B (+ header, config)")
    finally:
        engine.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    print(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = measured(args.rank, Path(tmp))
    print("\n| small model (float32, measured) | bytes per sync | sync total |\n|---|---:|---:|")
    for label, moved, seconds in rows:
        print(f"| {label} | {moved / 1e6:.3f} MB | {seconds * 1e3:.0f} ms |")
    print(f"| ratio | {rows[0][1] / rows[1][1]:.1f}x fewer | |")
    print(f"\n| model (bf16, computed) | full | LoRA r={args.rank}, all 4 targets | ratio |\n|---|---:|---:|---:|")
    for name, h, inter, layers, heads, kv, d, vocab, tied in PUBLISHED:
        full = 2 * full_params(h, inter, layers, heads, kv, d, vocab, tied)
        lora = 2 * adapter_params(h, inter, layers, heads, kv, d, args.rank)
        print(f"| {name} | {full / 1e9:.2f} GB | {lora / 1e6:.1f} MB | {full / lora:.0f}x |")


if __name__ == "__main__":
    main()
