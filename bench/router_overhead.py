"""What routing through slimeish costs: throughput and added latency, and per-turn cost growth.

A stand-in `/generate` server answers at once (fixed output, no model), so only routing costs
are measured. Three paths reach it:
  direct   client -> stand-in /generate                     (baseline)
  smg      client -> smg router -> stand-in /generate       (SGLang's Rust router)
  token-in client -> slimeish /s/<key>/generate -> stand-in (captured, like smg's input)
  chat     client -> slimeish /v1/chat/completions -> stand-in (render, capture, OpenAI reply)
  responses, messages (with --dialect): the same episode over /v1/responses or /v1/messages
Each session runs multi-turn episodes: every turn sends the previous tokens (or messages) plus a
short new user message. Run by hand:  .venv/bin/python bench/router_overhead.py
With `--family chatml qwen3`, the per-turn cost of long chat episodes is also measured for a
reasoning family (Qwen3's tiny model: every reply holds `<think>…</think>`, echoed back with its
`reasoning_content`, and each turn is bridged from the sampled tokens), beside ChatML's.
The client, the router and the stand-in share the machine's cores; the numbers include that. The
load generator is aiohttp, whose cost per request is small (httpx's is ~1.1 ms of CPU with many
connections, which alone saturated a 2-core machine at 256 sessions).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import get_args

import aiohttp
import orjson

from slimeish.common.procs import ManagedProcess, free_port, wait_http
from slimeish.models.tiny import Family, TinyModelConfig, make_tiny_model

OUTPUT_LEN = 8
# The stand-in's one reply (ids as the model's tokenizer writes it, its text without special
# tokens), set from --standin-reply by the process that serves it.
REPLY: dict = {}


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
        ids = REPLY["ids"]
        reply = {
            "text": REPLY["text"],
            "output_ids": ids,
            "meta_info": {
                "id": "r",
                "finish_reason": {"type": "stop", "matched": ids[-1]},
                "prompt_tokens": n_in,
                "completion_tokens": len(ids),
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


def standin_argv(port: int, reply: dict) -> list[str]:
    """The command that serves the stand-in on `port`, answering `reply` (`standin_reply(model)`)."""
    return [sys.executable, __file__, "--serve-standin", str(port), "--standin-reply", orjson.dumps(reply).decode()]


def serve_standin(port: int, reply: str) -> None:
    import uvicorn

    REPLY.update(orjson.loads(reply))
    uvicorn.run(standin_app, host="127.0.0.1", port=port, log_level="error", access_log=False)


# -- clients ----------------------------------------------------------------------------------------
USER_TAIL = [1, 302, 201, 74, 75, 76, 77, 2, 201, 1, 308, 201]  # "<|im_start|>user\n...<|im_end|>\n..."


class Stack:
    """The stand-in, a slimeish router and (for the load test) an smg router, as real processes."""

    def __init__(self, model: Path, log_dir: Path, reply: dict, smg: bool = True, routers: int = 1):
        self.procs: list[ManagedProcess] = []
        standin_port, smg_port = free_port(), free_port()
        self.standin = f"http://127.0.0.1:{standin_port}"
        self.smg = f"http://127.0.0.1:{smg_port}"
        self._start(standin_argv(standin_port, reply), self.standin, log_dir, "standin")
        # With several, they are replicas as `--num-routers` starts them: each its own process, the
        # sessions spread over them (here in turn), sharing nothing but the engine.
        self.routers, self.router_pids = [], []
        for i in range(routers):
            port = free_port()
            self.routers.append(f"http://127.0.0.1:{port}")
            self._start([sys.executable, "-m", "slimeish", "router", "--model", str(model), "--engine", self.standin,
                         "--port", str(port)], self.routers[-1], log_dir, f"router{i}")  # fmt: skip
            self.router_pids.append(self.procs[-1].pid)
        self.router, self.router_pid = self.routers[0], self.router_pids[0]
        if smg:  # one at a time: a second smg cannot bind its metrics port
            exe = shutil.which("smg") or str(Path(sys.executable).with_name("smg"))
            self._start([exe, "launch", "--host", "127.0.0.1", "--port", str(smg_port), "--worker-urls", self.standin,
                         "--policy", "round_robin"], self.smg, log_dir, "smg")  # fmt: skip

    def _start(self, args: list[str], url: str, log_dir: Path, name: str) -> None:
        proc = ManagedProcess(args, log_path=log_dir / f"{name}.log")
        self.procs.append(proc)
        wait_http(url + "/health", timeout=120, proc=proc.proc)

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()


JSON = {"content-type": "application/json"}


async def post_json(client: aiohttp.ClientSession, url: str, body: dict) -> dict:
    async with client.post(url, data=orjson.dumps(body), headers=JSON) as r:
        if r.status != 200:
            raise RuntimeError(f"{url} answered {r.status}: {(await r.read())[:300]!r}")
        return orjson.loads(await r.read())


def new_client(connections: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections), timeout=aiohttp.ClientTimeout(total=120)
    )


async def session_urls(stack: Stack, path: str, n: int) -> list[str]:
    routers = [stack.routers[i % len(stack.routers)] for i in range(n)]
    async with new_client(8) as client:
        sessions = [await post_json(client, router + "/sessions", {}) for router in routers]
    if path == "token-in":
        return [f"{router}/s/{s['api_key']}/generate" for router, s in zip(routers, sessions, strict=True)]
    if path == "messages":  # Anthropic's base URL is the session's without /v1
        return [s["base_url"].removesuffix("/v1") + "/v1/messages" for s in sessions]
    return [s["base_url"] + ("/responses" if path == "responses" else "/chat/completions") for s in sessions]


async def run_load(
    stack: Stack, path: str, concurrency: int, turns: int, think_s: float = 0.0, think_dist: str = "exp"
) -> dict:
    """`concurrency` sessions, each an episode of `turns` turns, all at once. With `think_s`, each
    session pauses after every answer (the agent's own work, or the generation time the instant
    stand-in leaves out) and starts at a random offset within one pause, so requests arrive spread
    out as from independent agents instead of in lockstep waves. The pause is drawn from an
    exponential distribution of mean `think_s` ("exp": together the agents send a Poisson stream)
    or is exactly `think_s` ("fixed": sessions that happen to queue behind each other answer
    together, pause together and queue again, so clumps form and grow over a run)."""
    if path in ("direct", "smg"):
        base = stack.standin if path == "direct" else stack.smg
        urls = [base + "/generate"] * concurrency
    else:
        urls = await session_urls(stack, path, concurrency)
    lat: list[float] = []

    async def session(step) -> None:
        await asyncio.sleep(random.uniform(0, think_s))
        for _ in range(turns):
            t0 = time.perf_counter()
            await step(client)
            lat.append(time.perf_counter() - t0)
            await asyncio.sleep(random.expovariate(1 / think_s) if think_s and think_dist == "exp" else think_s)

    async with new_client(concurrency) as client:
        t0, cpu0 = time.perf_counter(), cpu_seconds(*stack.router_pids)
        await asyncio.gather(*(session(_stepper(path, url)) for url in urls))
        wall, cpu = time.perf_counter() - t0, cpu_seconds(*stack.router_pids) - cpu0
    lat.sort()
    return {
        "path": path,
        "concurrency": concurrency,
        "think_ms": 1000 * think_s,
        "think_dist": think_dist,
        "requests": len(lat),
        "rps": len(lat) / wall,
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[int(len(lat) * 0.99)],
        "router_cpu_ms": 1000 * cpu / len(lat) if path not in ("direct", "smg") else None,
    }


def cpu_seconds(*pids: int) -> float:
    """CPU time used so far by all threads of processes `pids` (scheduler accounting, in ns)."""
    tasks = [t for pid in pids for t in Path(f"/proc/{pid}/task").iterdir()]
    return sum(int((t / "schedstat").read_text().split()[0]) for t in tasks) / 1e9


async def turn_costs(stack: Stack, path: str, sessions: int, turns: int) -> tuple[list[float], list[float]]:
    """Router CPU time and median client latency (ms) of every turn of long episodes.

    `sessions` episodes advance in lockstep, one request at a time; the router process's CPU time
    is read around each turn, so other load on the machine does not count."""
    urls = await session_urls(stack, path, sessions)
    steppers = [_stepper(path, url) for url in urls]
    cpu, wall = [], []
    async with new_client(8) as client:
        for _ in range(turns):
            c0, lat = cpu_seconds(*stack.router_pids), []
            for step in steppers:
                t0 = time.perf_counter()
                await step(client)
                lat.append(time.perf_counter() - t0)
            cpu.append(1e3 * (cpu_seconds(*stack.router_pids) - c0) / sessions)
            wall.append(1e3 * statistics.median(lat))
    return cpu, wall


def _stepper(path: str, url: str):
    """One turn per call of a growing episode (token-in ids, or messages / items in a dialect)."""
    ids = list(USER_TAIL)
    messages: list[dict] = [{"role": "user", "content": "count with me"}]
    system = "You are terse."

    async def step(client: aiohttp.ClientSession) -> None:
        nonlocal ids
        more = {"role": "user", "content": f"and {len(messages)}"}
        if path == "chat":
            body = {"model": "m", "messages": [{"role": "system", "content": system}, *messages]}
            r = await post_json(client, url, {**body, "max_tokens": OUTPUT_LEN})
            messages.extend([r["choices"][0]["message"], more])
        elif path == "responses":
            body = {"model": "m", "instructions": system, "input": messages, "max_output_tokens": OUTPUT_LEN}
            messages.extend([*(await post_json(client, url, body))["output"], more])
        elif path == "messages":
            body = {"model": "m", "system": system, "messages": messages, "max_tokens": OUTPUT_LEN}
            messages.extend([{"role": "assistant", "content": (await post_json(client, url, body))["content"]}, more])
        else:
            r = await post_json(client, url, {"input_ids": ids, "sampling_params": {"max_new_tokens": OUTPUT_LEN}})
            ids = ids + r["output_ids"] + USER_TAIL

    return step


def table(rows: list[dict], direct: dict[int, dict]) -> str:
    out = [
        "| path | sessions | requests | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | router CPU ms/req |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        d = direct[r["concurrency"]]
        cpu = "-" if r["router_cpu_ms"] is None else f"{r['router_cpu_ms']:.2f}"
        out.append(
            f"| {r['path']} | {r['concurrency']} | {r['requests']} | {r['rps']:.0f} | {r['p50_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {r['p50_ms'] - d['p50_ms']:+.2f} | {r['p99_ms'] - d['p99_ms']:+.2f} | {cpu} |"
        )
    return "\n".join(out)


async def load_table(args: argparse.Namespace, stack: Stack) -> str:
    rows, direct = [], {}
    for concurrency in args.concurrency:
        for path in ("direct", "smg", "token-in", "chat", *args.dialect):
            await run_load(stack, path, concurrency, 2)  # warm-up (connections, caches)
            row = await run_load(stack, path, concurrency, args.turns, args.think_ms / 1000, args.think_dist)
            rows.append(row)
            direct.setdefault(concurrency, row)
            print(row, flush=True)
    return table(rows, direct)


def long_header(args: argparse.Namespace) -> list[str]:
    # A single turn's CPU reading is noisy (a garbage collection, a health check): later turns are
    # the median of the last five. Turn 1 renders the whole conversation, later turns only the tail.
    late = f"turns {args.long_turns - 4}-{args.long_turns} (median)"
    return [
        "",
        f"Per-turn cost over {args.sessions} episodes of {args.long_turns} turns:",
        "",
        f"| path | family | router CPU ms, turn 1 | turns 2-6 (median) | {late} | ratio "
        f"{late.split(' (')[0]} / turn 1 | client latency ms, turn 1 | {late} |",
        "|" + "---|" * 8,
    ]


async def long_rows(args: argparse.Namespace, stack: Stack, family: str, paths: tuple[str, ...]) -> list[str]:
    lines = []
    for path in paths:
        cpu, wall = await turn_costs(stack, path, args.sessions, args.long_turns)
        early, last = statistics.median(cpu[1:6]), statistics.median(cpu[-5:])
        lines.append(
            f"| {path} | {family} | {cpu[0]:.2f} | {early:.2f} | {last:.2f} | {last / cpu[0]:.2f}x "
            f"| {wall[0]:.2f} | {statistics.median(wall[-5:]):.2f} |"
        )
        print(lines[-1], flush=True)
    return lines


def standin_reply(model: Path) -> dict:
    """The reply the stand-in sends for `model`: a short answer, after a reasoning block when the
    model's family reasons (its renderer's markers), then the end of turn, as the tokenizer writes it."""
    from slimeish.router.renderers.select import load_renderer

    renderer = load_renderer(model)
    text = "x" * (OUTPUT_LEN - 1)
    if renderer.reasoning_markers:
        opening, closing = renderer.reasoning_markers
        text = f"{opening}\nadd them up\n{closing}\n\n{text}"
    ids = [*renderer.encode(text), renderer.eos_token_id]
    return {"ids": ids, "text": renderer.decode(ids)}


async def bench(args: argparse.Namespace, stacks: dict[str, Stack]) -> str:
    (first, stack), *others = stacks.items()
    report = [await load_table(args, stack)]
    if args.no_long:
        return report[0]
    report += long_header(args)
    report += await long_rows(args, stack, first, ("token-in", "chat", *args.dialect))
    for family, other in others:  # the router's own cost per family: token-in does not render
        report += await long_rows(args, other, family, ("chat", *args.dialect))
    return "\n".join(report)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve-standin", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--turns", type=int, default=8, help="turns per session in the load test")
    parser.add_argument(
        "--think-ms", type=float, default=0.0,
        help="pause of each session after every answer (0: a closed loop, each session sends its next turn at once)",
    )  # fmt: skip
    parser.add_argument(
        "--think-dist", choices=("exp", "fixed"), default="exp",
        help="pauses drawn from an exponential distribution of mean --think-ms (independent agents), or all equal",
    )  # fmt: skip
    parser.add_argument(
        "--dialect", nargs="+", choices=("responses", "messages"), default=[],
        help="also run the episodes over these dialects, beside chat",
    )  # fmt: skip
    parser.add_argument("--no-long", action="store_true", help="skip the per-turn cost of long episodes")
    parser.add_argument("--long-turns", type=int, default=100, help="turns of the long episode")
    parser.add_argument("--sessions", type=int, default=40, help="long episodes run in lockstep")
    parser.add_argument(
        "--family", nargs="+", default=["chatml"], choices=get_args(Family),
        help="tiny models of these families (make-tiny-model --family): the first serves the load test; "
        "the long chat episodes run on each",
    )  # fmt: skip
    parser.add_argument(
        "--routers", type=int, default=1,
        help="slimeish router replicas (each a process, sessions spread over them in turn); router CPU is their sum",
    )  # fmt: skip
    parser.add_argument("--standin-reply", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_standin:
        return serve_standin(args.serve_standin, args.standin_reply)

    with tempfile.TemporaryDirectory() as tmp:
        stacks: dict[str, Stack] = {}
        try:
            for family in args.family:
                model = make_tiny_model(Path(tmp) / family, TinyModelConfig(family=family))
                (Path(tmp) / f"{family}-logs").mkdir()
                logs, reply = Path(tmp) / f"{family}-logs", standin_reply(model)
                # the load test runs on the first
                stacks[family] = Stack(model, logs, reply, smg=not stacks, routers=args.routers)
            # The load generator imported torch and transformers to build the models: without this
            # its own full collections (~130 ms each) land in the measured latencies of whichever path runs.
            gc.collect()
            gc.freeze()
            report = asyncio.run(bench(args, stacks))
        finally:
            for stack in stacks.values():
                stack.stop()
    print(f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the end, Python "
          f"{platform.python_version()}; think time {args.think_ms:g} ms ({args.think_dist}); "
          f"{args.routers} slimeish router process(es)\n\n{report}")  # fmt: skip


if __name__ == "__main__":
    main()
