"""What routing through slimeish costs: throughput and added latency, and per-turn cost growth.

A stand-in `/generate` server answers at once (fixed output, no model), so only routing costs
are measured. Three paths reach it:
  direct   client -> stand-in /generate                     (baseline)
  smg      client -> smg router -> stand-in /generate       (SGLang's Rust router)
  token-in client -> slimeish /s/<key>/generate -> stand-in (captured, like smg's input)
  chat     client -> slimeish /v1/chat/completions -> stand-in (render, capture, OpenAI reply)
Each session runs multi-turn episodes: every turn sends the previous tokens (or messages) plus a
short new user message. Run by hand:  .venv/bin/python bench/router_overhead.py
The client, the router and the stand-in share the machine's cores; the numbers include that.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from slimeish.procs import ManagedProcess, free_port, wait_http

OUTPUT_LEN = 8
EOS = 2  # `<|im_end|>` in the tiny tokenizer


# -- the stand-in engine (a bare ASGI app: its own cost should be as small as possible) -----------
async def standin_app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/generate":
        n_in = len(orjson.loads(body)["input_ids"])
        ids = [100 + i for i in range(OUTPUT_LEN - 1)] + [EOS]
        reply = {
            "text": "x" * (OUTPUT_LEN - 1),
            "output_ids": ids,
            "meta_info": {
                "id": "r",
                "finish_reason": {"type": "stop", "matched": EOS},
                "prompt_tokens": n_in,
                "completion_tokens": OUTPUT_LEN,
                "weight_version": "0",
                "output_token_logprobs": [[-0.5, t, None] for t in ids],
            },
        }
    else:  # /health, /model_info, /server_info ...
        reply = {"weight_version": "0", "model_path": "standin"}
    payload = orjson.dumps(reply)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def serve_standin(port: int) -> None:
    import uvicorn

    uvicorn.run(standin_app, host="127.0.0.1", port=port, log_level="error", access_log=False)


# -- clients ----------------------------------------------------------------------------------------
USER_TAIL = [1, 302, 201, 74, 75, 76, 77, 2, 201, 1, 308, 201]  # "<|im_start|>user\n...<|im_end|>\n..."


async def tokens_episode(client: httpx.AsyncClient, url: str, turns: int, lat: list[float]) -> None:
    ids = list(USER_TAIL)
    for _ in range(turns):
        t0 = time.perf_counter()
        r = await client.post(url, json={"input_ids": ids, "sampling_params": {"max_new_tokens": OUTPUT_LEN}})
        lat.append(time.perf_counter() - t0)
        ids = ids + r.json()["output_ids"] + USER_TAIL


async def chat_episode(client: httpx.AsyncClient, url: str, turns: int, lat: list[float]) -> None:
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "count with me"}]
    for turn in range(turns):
        t0 = time.perf_counter()
        r = await client.post(url, json={"model": "m", "messages": messages, "max_tokens": OUTPUT_LEN})
        lat.append(time.perf_counter() - t0)
        messages += [r.json()["choices"][0]["message"], {"role": "user", "content": f"and {turn}"}]


class Stack:
    """The stand-in, a slimeish router and an smg router, as real processes."""

    def __init__(self, model: Path, log_dir: Path):
        self.procs: list[ManagedProcess] = []
        standin_port, router_port, smg_port = free_port(), free_port(), free_port()
        self.standin = f"http://127.0.0.1:{standin_port}"
        self.router = f"http://127.0.0.1:{router_port}"
        self.smg = f"http://127.0.0.1:{smg_port}"
        self._start([sys.executable, __file__, "--serve-standin", str(standin_port)], self.standin, log_dir, "standin")
        self._start([sys.executable, "-m", "slimeish", "router", "--model", str(model), "--engine", self.standin,
                     "--port", str(router_port)], self.router, log_dir, "router")  # fmt: skip
        smg = shutil.which("smg") or str(Path(sys.executable).with_name("smg"))
        self._start([smg, "launch", "--host", "127.0.0.1", "--port", str(smg_port), "--worker-urls", self.standin,
                     "--policy", "round_robin"], self.smg, log_dir, "smg")  # fmt: skip

    def _start(self, args: list[str], url: str, log_dir: Path, name: str) -> None:
        proc = ManagedProcess(args, log_path=log_dir / f"{name}.log")
        self.procs.append(proc)
        wait_http(url + "/health", timeout=120, proc=proc.proc)

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()


async def session_urls(stack: Stack, path: str, n: int) -> list[str]:
    async with httpx.AsyncClient() as client:
        sessions = [(await client.post(stack.router + "/sessions", json={})).json() for _ in range(n)]
    if path == "token-in":
        return [f"{stack.router}/s/{s['api_key']}/generate" for s in sessions]
    return [s["base_url"] + "/chat/completions" for s in sessions]


async def run_load(stack: Stack, path: str, concurrency: int, turns: int) -> dict:
    """`concurrency` sessions, each an episode of `turns` turns, all at once."""
    if path in ("direct", "smg"):
        base = stack.standin if path == "direct" else stack.smg
        urls = [base + "/generate"] * concurrency
    else:
        urls = await session_urls(stack, path, concurrency)
    episode = chat_episode if path == "chat" else tokens_episode
    lat: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(episode(client, url, turns, lat) for url in urls))
        wall = time.perf_counter() - t0
    lat.sort()
    return {
        "path": path,
        "concurrency": concurrency,
        "requests": len(lat),
        "rps": len(lat) / wall,
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[int(len(lat) * 0.99)],
    }


async def turn_costs(stack: Stack, path: str, turns: int, episodes: int) -> list[float]:
    """Median latency (ms) of each turn index of one long sequential episode."""
    per_turn: list[list[float]] = [[] for _ in range(turns)]
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(episodes):
            if path == "direct":
                url = stack.standin + "/generate"
            else:
                (url,) = await session_urls(stack, path, 1)
            lat: list[float] = []
            await (chat_episode if path == "chat" else tokens_episode)(client, url, turns, lat)
            for i, x in enumerate(lat):
                per_turn[i].append(x)
    return [1000 * statistics.median(x) for x in per_turn]


def table(rows: list[dict], direct: dict[int, dict]) -> str:
    out = ["| path | sessions | requests | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms |", "|" + "---|" * 8]
    for r in rows:
        d = direct[r["concurrency"]]
        out.append(
            f"| {r['path']} | {r['concurrency']} | {r['requests']} | {r['rps']:.0f} | {r['p50_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {r['p50_ms'] - d['p50_ms']:+.2f} | {r['p99_ms'] - d['p99_ms']:+.2f} |"
        )
    return "\n".join(out)


async def bench(args: argparse.Namespace, stack: Stack) -> str:
    rows, direct = [], {}
    for concurrency in args.concurrency:
        for path in ("direct", "smg", "token-in", "chat"):
            await run_load(stack, path, concurrency, 2)  # warm-up (connections, caches)
            row = await run_load(stack, path, concurrency, args.turns)
            rows.append(row)
            direct.setdefault(concurrency, row)
            print(row, flush=True)
    lines = [table(rows, direct), "", "Per-turn cost of one long sequential episode (median ms over episodes):", ""]
    lines += ["| path | turn 1 | turn 100 | router turn 1 | router turn 100 | ratio |", "|" + "---|" * 6]
    base = await turn_costs(stack, "direct", args.long_turns, args.episodes)
    for path in ("token-in", "chat"):
        costs = await turn_costs(stack, path, args.long_turns, args.episodes)
        # the router's own cost: its latency minus the direct latency at the same turn (same input size)
        first, last = costs[0] - base[0], costs[-1] - base[-1]
        lines.append(
            f"| {path} | {costs[0]:.2f} | {costs[-1]:.2f} | {first:.2f} | {last:.2f} | {last / first:.2f}x |"
        )
    lines.append(f"| direct | {base[0]:.2f} | {base[-1]:.2f} | - | - | - |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve-standin", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--turns", type=int, default=8, help="turns per session in the load test")
    parser.add_argument("--long-turns", type=int, default=100, help="turns of the long episode")
    parser.add_argument("--episodes", type=int, default=5, help="long episodes (medians over them)")
    args = parser.parse_args()
    if args.serve_standin:
        return serve_standin(args.serve_standin)
    from slimeish.models.tiny import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "tiny")
        stack = Stack(model, Path(tmp))
        try:
            report = asyncio.run(bench(args, stack))
        finally:
            stack.stop()
    print(f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the end, Python "
          f"{platform.python_version()}\n\n{report}")  # fmt: skip


if __name__ == "__main__":
    main()
