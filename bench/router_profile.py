"""Where a dialect's router time goes: CPU per turn and garbage-collection pauses, per path.

`router_overhead.py` gives latencies, which depend on what else the machine runs. This runs the
same episodes (its stand-in engine and its clients) against a router whose collector is timed
(`gc.callbacks`), one path after the other, and reports per path what the router process alone
spent: CPU per request (the kernel's accounting of the process), the collections of each
generation with their count, total and longest pause, and the CPU of turn 1 against turn
`--turns`. Numbers of one run compare across paths even on a busy machine. Run by hand:
  .venv/bin/python bench/router_profile.py --sessions 256 --turns 20 --think-ms 1000
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from router_overhead import Stack, run_load, standin_argv, standin_reply, turn_costs

PATHS = ("token-in", "chat", "responses", "messages")


# -- the router, with its collector timed -------------------------------------------------------------
def serve_router(stats_path: str, argv: list[str]) -> None:
    """`slimeish router argv...`; SIGUSR1 writes the collections since the last one to `stats_path`
    (and, with $PROFILE_ROUTER set, the functions' CPU since then to `stats_path`.prof, cProfile's)."""
    pauses: list[tuple[int, float, int]] = []  # (generation, seconds, unreachable objects freed)
    started = [0.0]
    profiler = cProfile.Profile() if os.environ.get("PROFILE_ROUTER") else None

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - started[0], info["collected"]))

    def dump(*_) -> None:
        if profiler is not None:
            profiler.dump_stats(stats_path + ".prof")
            profiler.clear()
            profiler.enable()  # dump_stats disabled it
        Path(stats_path).write_text(json.dumps({"pauses": pauses, "objects": len(gc.get_objects())}))
        pauses.clear()

    gc.callbacks.append(timed)
    if profiler is not None:
        profiler.enable()
    signal.signal(signal.SIGUSR1, dump)
    from slimeish.router.server import main

    main(argv)


class ProfiledStack(Stack):
    """Stack whose router is `serve_router` (no smg: only the router's paths are profiled)."""

    def __init__(self, model: Path, log_dir: Path):
        from slimeish.common.procs import free_port

        self.procs = []
        self.stats = log_dir / "gc.json"
        standin_port, router_port = free_port(), free_port()
        self.standin = f"http://127.0.0.1:{standin_port}"
        self.router = f"http://127.0.0.1:{router_port}"
        self._start(standin_argv(standin_port, standin_reply(model)), self.standin, log_dir, "standin")
        self._start([sys.executable, __file__, "--serve-router", str(self.stats), "--model", str(model), "--engine",
                     self.standin, "--port", str(router_port)], self.router, log_dir, "router")  # fmt: skip
        self.router_pid = self.procs[-1].pid
        self.routers, self.router_pids = [self.router], [self.router_pid]

    async def gc_stats(self) -> dict:
        """The router's collections since the last call (`pauses`: (generation, seconds)) and the
        objects its collector tracks now (`objects`, those frozen at start-up left out)."""
        self.stats.unlink(missing_ok=True)
        os.kill(self.router_pid, signal.SIGUSR1)
        while not self.stats.exists():
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.05)  # written whole before the next read
        return json.loads(self.stats.read_text())


def gc_summary(stats: dict, requests: int) -> str:
    pauses, cells = stats["pauses"], [f"{stats['objects'] / 1000:.0f}k"]
    for generation in (0, 1, 2):
        ms = [1e3 * s for g, s, _ in pauses if g == generation]
        cells.append(f"{len(ms)} / {sum(ms) / requests:.3f} / {max(ms, default=0):.1f}")
    cells.append(f"{sum(p[2] for p in pauses) / requests:.1f}")
    return " | ".join(cells)


HEADER = [
    "| path | requests | router CPU ms/req | objects tracked after | gen0 collections: n / ms per req / "
    "longest ms | gen1 | gen2 | cyclic garbage per req | CPU ms turn 1 | turn {turns} |",
    "|" + "---|" * 10,
]


async def profile(args: argparse.Namespace, path: str, stack: ProfiledStack) -> str:
    """One path on a router of its own: the sessions an earlier path left open would otherwise be
    in the heap every later path's full collections walk."""
    await run_load(stack, path, 8, 2)  # warm-up
    await stack.gc_stats()
    row = await run_load(stack, path, args.sessions, args.turns, args.think_ms / 1000)
    gcs = gc_summary(await stack.gc_stats(), row["requests"])
    if args.profile:
        shutil.copy(f"{stack.stats}.prof", args.profile / f"{path}.prof")
    cpu, _ = await turn_costs(stack, path, args.long_sessions, args.long_turns)
    return f"| {path} | {row['requests']} | {row['router_cpu_ms']:.3f} | {gcs} | {cpu[0]:.2f} | {cpu[-1]:.2f} |"


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-router":
        return serve_router(sys.argv[2], sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=256, help="concurrent episodes of the load")
    parser.add_argument("--turns", type=int, default=20, help="turns per episode of the load")
    parser.add_argument("--think-ms", type=float, default=1000.0, help="mean pause after every answer")
    parser.add_argument("--long-sessions", type=int, default=20, help="episodes in lockstep for per-turn CPU")
    parser.add_argument("--long-turns", type=int, default=20, help="their turns")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--profile", type=Path, help="write each path's cProfile of the load to DIR/PATH.prof")
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        os.environ["PROFILE_ROUTER"] = "1"
    from slimeish.models.tiny import make_tiny_model

    lines = [HEADER[0].format(turns=args.long_turns), HEADER[1]]
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "tiny")
        gc.collect()
        gc.freeze()
        for path in args.paths:
            stack = ProfiledStack(model, Path(tmp))
            try:
                lines.append(asyncio.run(profile(args, path, stack)))
            finally:
                stack.stop()
            print(lines[-1], flush=True)
    report = "\n".join(lines)
    print(f"\n{args.sessions} sessions x {args.turns} turns, think {args.think_ms:g} ms\n\n{report}")


if __name__ == "__main__":
    main()
