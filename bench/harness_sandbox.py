"""Sandbox cost per provider: claim (create) latency cold and from a warm pool, and oracle episodes/s at a concurrency.

No model and no router: each episode is `run_episode` on an example task with its reference
solution as the agent (Harbor's oracle), so what is measured is the sandbox and grading
machinery itself (create, copy the workspace out twice, a fresh grader sandbox, test.sh). A warm
claim is taken once the pool (`--sandbox-pool 1`) has rebuilt its sandbox, as between episodes that
last longer than a build. Run by hand:

    .venv/bin/python bench/harness_sandbox.py --creates 40 --episodes 32 --concurrency 16
    .venv/bin/python bench/harness_sandbox.py --provider docker  # as root: DOCKER_HOST's daemon, else one of its own
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Literal

from slimeish.rollout_functions.harness.docker import DockerProvider
from slimeish.rollout_functions.harness.dockerd import answers, own_daemon
from slimeish.rollout_functions.harness.episode import EpisodeSpec, run_episode
from slimeish.rollout_functions.harness.local import LocalProvider
from slimeish.rollout_functions.harness.pool import WarmPool
from slimeish.rollout_functions.harness.sandbox import SandboxProvider
from slimeish.rollout_functions.harness.tasks import find_tasks

TASKS = Path(__file__).resolve().parents[1] / "examples" / "coding_tasks" / "tasks"


def percentiles(values: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(values, n=20)
    return {"p50_ms": round(statistics.median(values) * 1e3, 1), "p95_ms": round(cuts[18] * 1e3, 1)}


async def claims(provider: SandboxProvider, n: int) -> dict[str, float]:
    """Claim latency of the `count-lines` task (a workspace built by setup.sh); from a pool, each
    claim waits for the pool to hold a ready sandbox first."""
    task = next(t for t in find_tasks(TASKS) if t.name == "count-lines")
    took = []
    for _ in range(n):
        if isinstance(provider, WarmPool):
            provider.fill(task)
            while provider.ready(task) < provider.size:
                await asyncio.sleep(0.01)
        started = time.perf_counter()
        sandbox = await provider.create(task)
        took.append(time.perf_counter() - started)
        await sandbox.destroy()
    return percentiles(took)


async def episodes(provider: SandboxProvider, n: int, concurrency: int) -> dict[str, object]:
    tasks, limit = find_tasks(TASKS), asyncio.Semaphore(concurrency)

    async def called() -> bool:
        return True

    async def one(i: int) -> float:
        task = tasks[i % len(tasks)]
        spec = EpisodeSpec(task=task, agent_command=f"bash {task.solution}/solve.sh", env={}, timeout_s=120)
        async with limit:
            outcome = await run_episode(provider, spec, called)
        assert outcome.reward == 1.0, outcome
        return outcome.timings["sandbox_create_s"]

    started = time.perf_counter()
    creates = await asyncio.gather(*(one(i) for i in range(n)))
    elapsed = time.perf_counter() - started
    return {"episodes_per_s": round(n / elapsed, 2), "create_under_load": percentiles(list(creates))}


async def measure(provider: SandboxProvider, args: argparse.Namespace) -> dict[str, object]:
    result: dict[str, object] = {"claim": await claims(provider, args.creates)}
    warm = WarmPool(provider, 1)
    result["claim_warm"] = await claims(warm, args.creates)
    await warm.drain()
    result |= await episodes(provider, args.episodes, args.concurrency)
    pooled = WarmPool(provider, args.pool)
    result["pooled"] = await episodes(pooled, args.episodes, args.concurrency)
    await pooled.drain()
    return result


def docker_host(stack: contextlib.ExitStack, root: str) -> str:
    """DOCKER_HOST's daemon (or the default socket's) when one answers, else a dockerd of our own."""
    url = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if url.startswith("unix://") and answers(Path(url.removeprefix("unix://"))):
        return url
    return stack.enter_context(own_daemon(Path(root) / "dockerd"))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", choices=["local", "docker"], default="local")
    parser.add_argument("--creates", type=int, default=40)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pool", type=int, default=2, help="warm sandboxes per task in the pooled episodes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root, contextlib.ExitStack() as stack:
        if args.provider == "docker":
            provider = DockerProvider(url=docker_host(stack, root))
            print(json.dumps({"provider": "docker"} | await measure(provider, args)), flush=True)
            return
        modes: tuple[Literal["on"], Literal["off"]] = ("on", "off")
        for bwrap in modes:
            result = await measure(LocalProvider(Path(root) / bwrap, bwrap), args)
            print(json.dumps({"bwrap": bwrap} | result), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
