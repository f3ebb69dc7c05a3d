"""Router CPU per turn of several versions of the router code, measured side by side.

A busy machine moves a router's CPU time per turn by 2x from one run to the next, so versions
measured in separate runs cannot be compared. This starts one router per version (its code
given as a directory put first on its PYTHONPATH: a `git worktree add` of another commit, with
`slimeish/router`, `slimeish/buffer` and `slimeish/rollout_functions` linked to its top-level
folders; '' is this checkout), each with its own stand-in engine, and advances their lockstep
episodes one turn at a time in rotating order, so every version sees the same load. Reported per
path: each version's median CPU ms per turn (turns 2..N) and the median of its per-turn ratio to
the first version. Run by hand, e.g.:
  .venv/bin/python bench/router_cpu_ab.py /tmp/old '' /tmp/old '' --paths token-in chat
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
from pathlib import Path

import router_overhead as ro

from slimeish.common.procs import ManagedProcess, wait_http
from slimeish.models.tiny import make_tiny_model


class VersionStack(ro.Stack):
    """`router_overhead.Stack` (no smg) whose router runs the code under `code`."""

    def __init__(self, model: Path, log_dir: Path, reply: dict, code: str):
        self.code = code
        log_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(model, log_dir, reply, smg=False)

    def _start(self, args: list[str], url: str, log_dir: Path, name: str) -> None:
        env = {"PYTHONPATH": self.code} if self.code and name == "router0" else None
        proc = ManagedProcess(args, log_path=log_dir / f"{name}.log", env=env)
        self.procs.append(proc)
        wait_http(url + "/health", timeout=120, proc=proc.proc)


async def compare(args: argparse.Namespace, stacks: list[VersionStack]) -> None:
    for path in args.paths:
        steppers = []
        for stack in stacks:
            await ro.run_load(stack, path, 8, 2)  # warm-up
            steppers.append([ro._stepper(path, url) for url in await ro.session_urls(stack, path, args.sessions)])
        cpu: list[list[float]] = [[] for _ in stacks]
        async with ro.new_client(8) as client:
            for turn in range(args.turns):
                for i in (order := list(range(len(stacks))))[turn % len(order) :] + order[: turn % len(order)]:
                    c0 = ro.cpu_seconds(stacks[i].router_pid)
                    for step in steppers[i]:
                        await step(client)
                    if turn:  # turn 1 renders or plans the whole prompt
                        cpu[i].append(1e3 * (ro.cpu_seconds(stacks[i].router_pid) - c0) / args.sessions)
        cells = []
        for code, c in zip(args.code, cpu, strict=True):
            ratio = statistics.median(a / b for a, b in zip(c, cpu[0], strict=True))
            cells.append(f"{code or 'this checkout'}: {statistics.median(c):.3f} ({ratio:.2f}x)")
        print(f"| {path} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("code", nargs="+", help="each router's code directory ('' = this checkout)")
    parser.add_argument(
        "--paths", nargs="+", choices=("token-in", "chat", "responses", "messages"), default=["token-in", "chat"]
    )
    parser.add_argument("--sessions", type=int, default=32, help="episodes per router, advanced in lockstep")
    parser.add_argument("--turns", type=int, default=12, help="turns per episode")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "tiny")
        reply, stacks = ro.standin_reply(model), []
        try:
            for i, code in enumerate(args.code):
                stacks.append(VersionStack(model, Path(tmp) / f"logs{i}", reply, code))
            gc.collect()
            gc.freeze()
            asyncio.run(compare(args, stacks))
        finally:
            for stack in stacks:
                stack.stop()
    print(f"load average {Path('/proc/loadavg').read_text().split()[0]} at the end")


if __name__ == "__main__":
    main()
