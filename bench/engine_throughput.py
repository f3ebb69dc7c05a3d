"""Output tokens/s: the embedded engine (continuous batching) vs Hugging Face `generate` (static batching).

Same model, same prompts, same sampling (temperature 1, no top-k/top-p), same per-request output
lengths (uniform in [8, 256], forced with ignore_eos), same torch thread count. At concurrency c,
the engine gets c clients that each send their next request as soon as the last one returns;
`generate` gets the requests in batches of c, each batch running until its longest request is
done (finished rows keep decoding, as static batching does). Only requested tokens are counted.

Besides tokens/s, each side's CPU time per requested token (user + system: the engine process's
from /proc, HF's the bench process's during `generate`): on a shared machine wall-clock rates swing
with the load, while CPU time per token moves much less, so A/B comparisons of code use it.

Run by hand (not part of the tests):
    .venv/bin/python bench/engine_throughput.py                       # default tiny model
    .venv/bin/python bench/engine_throughput.py --hidden-size 256 --num-layers 4 --num-heads 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from pathlib import Path

import httpx
import torch

from slimeish.common.procs import ManagedProcess, free_port, wait_http
from slimeish.models.tiny import TinyModelConfig, make_tiny_model


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_workload(n: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(10, vocab) for _ in range(rng.randint(16, 64))], rng.randint(8, 256)) for _ in range(n)]


async def run_engine(url: str, work: list[tuple[list[int], int]], concurrency: int) -> tuple[int, float]:
    queue: asyncio.Queue = asyncio.Queue()
    for item in work:
        queue.put_nowait(item)
    produced = 0

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal produced
        while not queue.empty():
            prompt, n = queue.get_nowait()
            params = {"max_new_tokens": n, "ignore_eos": True, "temperature": 1.0}
            r = await client.post("/generate", json={"input_ids": prompt, "sampling_params": params})
            r.raise_for_status()
            produced += r.json()["meta_info"]["completion_tokens"]

    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=128)) as client:
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        return produced, time.perf_counter() - start


@torch.inference_mode()
def run_hf(model, pad_id: int, work: list[tuple[list[int], int]], concurrency: int) -> tuple[int, float]:
    start, produced = time.perf_counter(), 0
    for i in range(0, len(work), concurrency):
        batch = work[i : i + concurrency]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p, _ in batch])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        longest = max(n for _, n in batch)
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
            do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=pad_id,
        )  # fmt: skip
        assert out.shape[1] == width + longest
        produced += sum(n for _, n in batch)
    return produced, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="HF checkpoint dir (default: build a tiny model)")
    parser.add_argument("--hidden-size", type=int, default=64, help="tiny model width when building one")
    parser.add_argument("--num-layers", type=int, default=2, help="tiny model layers when building one")
    parser.add_argument("--num-heads", type=int, default=4, help="tiny model heads when building one")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64], help="levels to measure")
    parser.add_argument("--requests", type=int, nargs="+", default=[12, 48, 128], help="requests per level")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, both sides")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or make_tiny_model(
            Path(tmp) / "model",
            TinyModelConfig(
                hidden_size=args.hidden_size, intermediate_size=args.hidden_size * 11 // 4,
                num_layers=args.num_layers, num_heads=args.num_heads, num_kv_heads=max(1, args.num_heads // 2),
            ),
        )  # fmt: skip
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        model.generation_config.eos_token_id = None  # same as ignore_eos: every request runs its full length
        params = sum(p.numel() for p in model.parameters())
        port = free_port()
        engine = ManagedProcess.slimeish(
            "engine", "--model", str(model_dir), "--port", str(port), "--cpu-threads", str(args.threads)
        )
        try:
            wait_http(f"http://127.0.0.1:{port}/health", timeout=120, proc=engine.proc)
            print(f"model: {params / 1e6:.2f}M params, threads={args.threads}, load before: {os.getloadavg()}")
            print(
                "| concurrency | requests | output tokens | engine tok/s | HF generate tok/s | ratio "
                "| engine CPU µs/token | HF CPU µs/token | CPU ratio (HF / engine) |"
            )
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for c, n in zip(args.concurrency, args.requests, strict=True):
                work = make_workload(n, model.config.vocab_size, args.seed + c)
                asyncio.run(run_engine(f"http://127.0.0.1:{port}", work[: min(4, n)], c))  # warm up
                e_cpu = process_cpu_seconds(engine.pid)
                e_tokens, e_time = asyncio.run(run_engine(f"http://127.0.0.1:{port}", work, c))
                e_cpu = process_cpu_seconds(engine.pid) - e_cpu
                h_cpu = time.process_time()
                h_tokens, h_time = run_hf(model, model.config.pad_token_id, work, c)
                h_cpu = time.process_time() - h_cpu
                assert e_tokens == h_tokens
                e_rate, h_rate = e_tokens / e_time, h_tokens / h_time
                e_us, h_us = 1e6 * e_cpu / e_tokens, 1e6 * h_cpu / h_tokens
                print(
                    f"| {c} | {n} | {e_tokens} | {e_rate:.0f} | {h_rate:.0f} | {e_rate / h_rate:.2f}x "
                    f"| {e_us:.0f} | {h_us:.0f} | {h_us / e_us:.2f}x |",
                    flush=True,
                )
            print(f"load after: {os.getloadavg()}")
        finally:
            engine.stop()


if __name__ == "__main__":
    main()
