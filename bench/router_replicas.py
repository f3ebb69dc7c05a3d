"""Router replicas: turns/s of one vs two slimeish routers in front of the same engine.

A closed loop (every session sends its next turn as soon as the last is answered) against the
instant stand-in engine of `router_overhead.py`, so only routing costs are measured. The same
sessions are opened on the first router, or spread round robin over both; each process's CPU
seconds over the measured window are reported (routers, stand-in, load generator), as all share
the machine's cores: on 2 cores, two routers gain only what the stand-in and the client leave.
Run by hand:  .venv/bin/python bench/router_replicas.py [--path chat|token-in] [--concurrency 256]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

from router_overhead import _stepper, cpu_seconds, new_client, post_json, standin_argv, standin_reply

from slimeish.common.procs import ManagedProcess, free_port, wait_http


class Replicas:
    """The stand-in engine and `n` routers in front of it, as real processes."""

    def __init__(self, model: Path, log_dir: Path, n: int):
        self.procs: dict[str, ManagedProcess] = {}
        port = free_port()
        self.standin = f"http://127.0.0.1:{port}"
        self._start("standin", standin_argv(port, standin_reply(model)), self.standin, log_dir)
        self.routers = []
        for i in range(n):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            argv = [sys.executable, "-m", "slimeish", "router", "--model", str(model), "--engine", self.standin,
                    "--port", str(port), "--router-id", f"router{i}"]  # fmt: skip
            self._start(f"router{i}", argv, url, log_dir)
            self.routers.append(url)

    def _start(self, name: str, argv: list[str], url: str, log_dir: Path) -> None:
        self.procs[name] = proc = ManagedProcess(argv, log_path=log_dir / f"{name}.log")
        wait_http(url + "/health", timeout=120, proc=proc.proc)

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(p.pid) for name, p in self.procs.items()} | {"client": cpu_seconds(os.getpid())}

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop()


async def closed_loop(stack: Replicas, routers: int, path: str, concurrency: int, turns: int) -> dict:
    """`concurrency` sessions spread round robin over the first `routers` routers, `turns` each."""
    async with new_client(8) as client:
        sessions = [await post_json(client, stack.routers[i % routers] + "/sessions", {}) for i in range(concurrency)]
    if path == "token-in":
        urls = [s["base_url"].removesuffix("/v1") + "/generate" for s in sessions]
    else:
        urls = [s["base_url"] + "/chat/completions" for s in sessions]

    async def session(step) -> None:
        for _ in range(turns):
            await step(client)

    async with new_client(concurrency) as client:
        cpu0, t0 = stack.cpu(), time.perf_counter()
        await asyncio.gather(*(session(_stepper(path, url)) for url in urls))
        wall, cpu1 = time.perf_counter() - t0, stack.cpu()
    return {"routers": routers, "turns_per_s": concurrency * turns / wall} | {
        f"cpu_{name}": (cpu1[name] - cpu0[name]) / wall for name in cpu0
    }


async def bench(args: argparse.Namespace, stack: Replicas) -> list[dict]:
    rows = []
    for routers in (1, 2):
        await closed_loop(stack, routers, args.path, args.concurrency, 2)  # warm-up
        rows.append(await closed_loop(stack, routers, args.path, args.concurrency, args.turns))
        print(rows[-1], flush=True)
    return rows


def report(rows: list[dict], args: argparse.Namespace) -> str:
    names = [k for k in rows[0] if k.startswith("cpu_")]
    lines = [
        f"{args.path}, {args.concurrency} sessions x {args.turns} turns, closed loop, {os.cpu_count()} cores; "
        "CPU = cores busy over the run (1.0 = one core)",
        "",
        "| routers | turns/s | " + " | ".join(n.removeprefix("cpu_") for n in names) + " |",
        "|" + "---|" * (2 + len(names)),
    ]
    for r in rows:
        lines.append(f"| {r['routers']} | {r['turns_per_s']:.0f} | " + " | ".join(f"{r[n]:.2f}" for n in names) + " |")
    lines.append(f"\nratio 2 / 1 routers: {rows[1]['turns_per_s'] / rows[0]['turns_per_s']:.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", choices=("chat", "token-in"), default="chat")
    parser.add_argument("--concurrency", type=int, default=256, help="sessions at once")
    parser.add_argument("--turns", type=int, default=8, help="turns per session")
    args = parser.parse_args()
    from slimeish.models.tiny import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "tiny")
        stack = Replicas(model, Path(tmp), 2)
        gc.collect()
        gc.freeze()  # the load generator's own full collections stay out of the measurement
        try:
            rows = asyncio.run(bench(args, stack))
        finally:
            stack.stop()
    print("\n" + report(rows, args))


if __name__ == "__main__":
    main()
