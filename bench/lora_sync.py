"""Bytes moved per weight sync: a LoRA run's adapter against the full model.

Measured: a small model (tests' tiny family, wider) is trained one step, full and with LoRA, and
each pushes its weights to a real embedded engine with `WeightSync` (method `tensor`: files in
shared memory that the engine loads by path); the bytes are those files' sizes, the time the
sync's total (pause, write, load, continue). Computed: the same count for published model
shapes (bf16), with the formula the measured run checks (adapter bytes = the exported tensors).
`--arch qwen3_moe`: the same on a small Qwen3-MoE (LoRA on attention and every routed expert, the
default targets), and published Qwen3-MoE shapes.
Run by hand:  .venv/bin/python bench/lora_sync.py [--rank 16] [--arch qwen3_moe]
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


# (name, hidden, expert intermediate, layers, heads, kv heads, head dim, vocab, experts)
PUBLISHED_MOE = [
    ("Qwen3-30B-A3B", 2048, 768, 48, 32, 4, 128, 151936, 128),
    ("Qwen3-235B-A22B", 4096, 1536, 94, 64, 4, 128, 151936, 128),
]


def full_params(h: int, inter: int, layers: int, heads: int, kv: int, d: int, vocab: int, tied: bool) -> int:
    attn = h * heads * d + 2 * h * kv * d + heads * d * h
    per_layer = attn + 3 * h * inter + 2 * h + 2 * d  # norms (incl. qk-norm; a rounding error elsewhere)
    return layers * per_layer + vocab * h * (1 if tied else 2) + h


def _attention_adapter(h: int, heads: int, kv: int, d: int, r: int) -> int:
    return sum(r * i + o * r for i, o in [(h, heads * d), (h, kv * d), (h, kv * d), (heads * d, h)])


def adapter_params(h: int, inter: int, layers: int, heads: int, kv: int, d: int, r: int) -> int:
    """PEFT's tensors as `Trainer.export_peft` writes them: one (A, B) per HF module of the four
    Megatron targets (q, k and v share the fused layer's A, stored once per module)."""
    mlp = sum(r * i + o * r for i, o in [(h, inter), (h, inter), (inter, h)])
    return layers * (_attention_adapter(h, heads, kv, d, r) + mlp)


def moe_full_params(h: int, inter: int, layers: int, heads: int, kv: int, d: int, vocab: int, experts: int) -> int:
    attn = h * heads * d + 2 * h * kv * d + heads * d * h
    per_layer = attn + experts * (3 * h * inter + h) + 2 * h + 2 * d  # experts, router, norms
    return layers * per_layer + 2 * vocab * h + h


def moe_adapter_params(h: int, inter: int, layers: int, heads: int, kv: int, d: int, experts: int, r: int) -> int:
    """Attention as above, and each routed expert's gate_up (A [r, h], B [2 inter, r]) and down."""
    per_expert = r * h + 2 * inter * r + r * inter + h * r
    return layers * (_attention_adapter(h, heads, kv, d, r) + experts * per_expert)


def _samples():
    from slimeish.common.sample import Sample

    tokens = [[1, 40, 41, 42, 43, 44], [1, 50, 51, 52, 53, 54]]
    return [Sample(group_index=0, index=i, tokens=t, response_length=3, loss_mask=[1] * 3, reward=float(i))
            for i, t in enumerate(tokens)]  # fmt: skip


def measured(rank: int, work: Path, arch: str) -> list[tuple[str, int, float]]:
    from slimeish.trainer.config import TrainerConfig
    from slimeish.trainer.distributed import init_distributed
    from slimeish.trainer.trainer import Trainer
    from slimeish.trainer.weight_sync import WeightSync, WeightSyncConfig

    os.environ.setdefault("OMP_NUM_THREADS", "2")
    init_distributed(use_gpu=False)
    moe = dict(num_experts=8, moe_intermediate_size=128) if arch == "qwen3_moe" else {}
    cfg = TinyModelConfig(arch=arch, hidden_size=256, intermediate_size=704, num_layers=4, num_heads=8, num_kv_heads=4,
                          **moe)  # type: ignore[arg-type]  # fmt: skip
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
        expected = 4 * (  # float32
            moe_adapter_params(head, 128, layers, heads, kv, head // heads, 8, rank)
            if moe
            else adapter_params(head, inter, layers, heads, kv, head // heads, rank)
        )
        print(f"check: adapter tensors {expected} B by the formula; the adapter file {rows[1][1]} B (+ header, config)")
    finally:
        engine.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--arch", choices=["qwen2", "qwen3_moe"], default="qwen2")
    args = parser.parse_args()
    print(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = measured(args.rank, Path(tmp), args.arch)
    print("\n| small model (float32, measured) | bytes per sync | sync total |\n|---|---:|---:|")
    for label, moved, seconds in rows:
        print(f"| {label} | {moved / 1e6:.3f} MB | {seconds * 1e3:.0f} ms |")
    print(f"| ratio | {rows[0][1] / rows[1][1]:.1f}x fewer | |")
    if args.arch == "qwen3_moe":
        print(f"\n| model (bf16, computed) | full | LoRA r={args.rank}, attention + experts | ratio |")
        print("|---|---:|---:|---:|")
        for name, h, inter, layers, heads, kv, d, vocab, experts in PUBLISHED_MOE:
            full = 2 * moe_full_params(h, inter, layers, heads, kv, d, vocab, experts)
            lora = 2 * moe_adapter_params(h, inter, layers, heads, kv, d, experts, args.rank)
            print(f"| {name} | {full / 1e9:.2f} GB | {lora / 1e6:.1f} MB | {full / lora:.0f}x |")
        return
    print(f"\n| model (bf16, computed) | full | LoRA r={args.rank}, all 4 targets | ratio |\n|---|---:|---:|---:|")
    for name, h, inter, layers, heads, kv, d, vocab, tied in PUBLISHED:
        full = 2 * full_params(h, inter, layers, heads, kv, d, vocab, tied)
        lora = 2 * adapter_params(h, inter, layers, heads, kv, d, args.rank)
        print(f"| {name} | {full / 1e9:.2f} GB | {lora / 1e6:.1f} MB | {full / lora:.0f}x |")


if __name__ == "__main__":
    main()
