"""Agent-sized contexts on the embedded engine: one long prompt, and an episode that resends its history.

1. Long prompt: one `--prompt-tokens` prompt (default 65,000) through a real `slimeish engine`
   process, `max_new_tokens` 1. Reports the engine process's peak RSS (VmHWM) and the prefill time,
   against the same prompt through Hugging Face `forward` in chunks of `--chunk` tokens with a
   `DynamicCache` (the baseline; one forward over the whole prompt builds a dense mask and does not
   fit), in this process.
2. Episode: `--turns` turns, the first prompt `--first-tokens` long (a harness's system prompt
   and tools: 15k-50k tokens for Claude Code; default one turn's worth), each later prompt the
   previous prompt plus the previous output plus `--turn-tokens` new tokens (growing to ~60k), sent
   to an engine with the prefix cache and to one with `--disable-radix-cache`, both running at once
   and each turn sent to both back to back (alternating which goes first), so a turn's two times
   share the machine's load. Reports each
   turn's prefill time (the streamed request's time to its first token) and whole-request time on
   both, their ratios, and whether `cached_tokens` equals the shared prefix (the previous turn's
   prompt and output, less the last output token, whose KV is never computed, rounded down to
   whole pages).

Both engines and HF use `--threads` torch threads. Run by hand (not part of the tests):
    .venv/bin/python bench/engine_long_context.py
    .venv/bin/python bench/engine_long_context.py --prompt-tokens 16000 --turns 8 --turn-tokens 2000
    .venv/bin/python bench/engine_long_context.py --skip long --first-tokens 20000 --turn-tokens 2000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

import httpx
import torch
from transformers import AutoConfig

from slimeish.common.procs import ManagedProcess, free_port, wait_http
from slimeish.models.tiny import TinyModelConfig, make_tiny_model

PAGE = 16  # the engine's default --page-size


def start_engine(model: Path, threads: int, *flags: str) -> tuple[ManagedProcess, httpx.Client]:
    port = free_port()
    argv = ["engine", "--model", str(model), "--port", str(port), "--cpu-threads", str(threads), *flags]
    proc = ManagedProcess.slimeish(*argv)
    wait_http(f"http://127.0.0.1:{port}/health", timeout=120, proc=proc.proc)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=3600)
    generate(client, [11, 12, 13], 4)  # warm up (lazy torch initialisation), cached by nobody: < one page
    return proc, client


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/PID/status")


def generate(client: httpx.Client, prompt: list[int], new_tokens: int) -> tuple[dict, float]:
    out, _, seconds = stream(client, prompt, new_tokens)
    return out, seconds


def stream(client: httpx.Client, prompt: list[int], new_tokens: int) -> tuple[dict, float, float]:
    """The streamed request's last chunk, its time to the first chunk (the prefill and the first
    token's sampling) and its whole time."""
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    body = {"input_ids": prompt, "sampling_params": params, "stream": True}
    start = time.perf_counter()
    first, last = 0.0, ""
    with client.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                first = first or time.perf_counter() - start
                last = line
    return json.loads(last[len("data: ") :]), first, time.perf_counter() - start


@torch.inference_mode()
def hf_chunked_prefill(model_dir: Path, prompt: list[int], chunk: int) -> float:
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cache = DynamicCache()
    start = time.perf_counter()
    for a in range(0, len(prompt), chunk):
        ids = torch.tensor([prompt[a : a + chunk]])
        model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return time.perf_counter() - start


def long_prompt(model_dir: Path, args, vocab: int) -> None:
    rng = random.Random(args.seed)
    prompt = [rng.randrange(10, vocab) for _ in range(args.prompt_tokens)]
    proc, client = start_engine(model_dir, args.threads, "--max-total-tokens", str(args.prompt_tokens + 1024))
    try:
        rss_idle = peak_rss_mb(proc.pid)
        out, seconds = generate(client, prompt, 1)
        assert out["meta_info"]["prompt_tokens"] == len(prompt)
        rss = peak_rss_mb(proc.pid)
    finally:
        client.close()
        proc.stop()
    hf = hf_chunked_prefill(model_dir, prompt, args.chunk)
    print(f"\n### {len(prompt)}-token prompt, max_new_tokens 1")
    print("| engine peak RSS (after load) | engine prefill | HF forward in chunks of", args.chunk, "| engine / HF |")
    print("|---:|---:|---:|---:|")
    print(f"| {rss / 1024:.2f} GB ({rss_idle / 1024:.2f} GB) | {seconds:.1f} s | {hf:.1f} s | {seconds / hf:.2f} |")


def episode_tokens(args) -> int:
    """The last turn's prompt and output."""
    first = args.first_tokens or args.turn_tokens
    return first + (args.turns - 1) * (args.turn_tokens + args.new_tokens) + args.new_tokens


def episode(model_dir: Path, args, vocab: int) -> None:
    rng = random.Random(args.seed + 1)
    pool = str(episode_tokens(args) + 4096)
    engines = {
        label: start_engine(model_dir, args.threads, "--max-total-tokens", pool, *flags)
        for label, flags in (("cache", []), ("no cache", ["--disable-radix-cache"]))
    }
    first = args.first_tokens or args.turn_tokens
    shape = f"{first} tokens first, +{args.turn_tokens} a turn, {args.new_tokens} output tokens"
    print(f"\n### {args.turns}-turn episode, {shape}")
    print("| turn | prompt tokens | cached_tokens (expected) | prefill with cache | without | ratio "
          "| request with cache | without | ratio |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    try:
        history: list[int] = []
        for turn in range(1, args.turns + 1):
            shared = len(history) - 1 if history else 0  # the last output token has no KV yet
            new = args.turn_tokens if history else first
            prompt = history + [rng.randrange(10, vocab) for _ in range(new)]
            order = list(engines) if turn % 2 else list(engines)[::-1]
            times = {label: stream(engines[label][1], prompt, args.new_tokens) for label in order}
            (out, p_hit, t_hit), (_, p_miss, t_miss) = times["cache"], times["no cache"]
            cached, expected = out["meta_info"]["cached_tokens"], shared - shared % PAGE
            print(
                f"| {turn} | {len(prompt)} | {cached} ({expected}) | {p_hit:.2f} s | {p_miss:.2f} s "
                f"| {p_hit / p_miss:.3f} | {t_hit:.2f} s | {t_miss:.2f} s | {t_hit / t_miss:.3f} |",
                flush=True,
            )
            history = prompt + out["output_ids"]
    finally:
        for proc, client in engines.values():
            client.close()
            proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-tokens", type=int, default=65_000, help="the long prompt's length")
    parser.add_argument("--chunk", type=int, default=2048, help="HF baseline chunk (the engine's default too)")
    parser.add_argument("--turns", type=int, default=20, help="episode turns")
    parser.add_argument("--turn-tokens", type=int, default=3000, help="new prompt tokens each turn")
    parser.add_argument("--first-tokens", type=int, default=0, help="the first prompt's tokens (0: --turn-tokens)")
    parser.add_argument("--new-tokens", type=int, default=16, help="output tokens each turn")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, engine and HF")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip", choices=["long", "episode"], help="leave one part out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    context = max(args.prompt_tokens, episode_tokens(args)) + 1024
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / "model", TinyModelConfig(max_position_embeddings=context))
        vocab = AutoConfig.from_pretrained(model_dir).vocab_size
        print(f"tiny model (context {context}), threads={args.threads}, load before: {os.getloadavg()}")
        if args.skip != "long":
            long_prompt(model_dir, args, vocab)
        if args.skip != "episode":
            episode(model_dir, args, vocab)
        print(f"\nload after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
