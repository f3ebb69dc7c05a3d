"""Samples trained per second, sync vs async (staleness 1 and 2), with heavy-tailed episodes.

The full stack runs (`slimeish train`: embedded buffer, engine, router, Megatron trainer on CPU)
with `bench/heavy_tail_agent.py`: one real chat turn through the router, plus a wait that is not
CPU work, `base` for 90 % of episodes and 20 x `base` for 10 %.

Every mode gets the same capacity C, the number of episodes allowed to run at once:
  sync          rollout_batch_size = C / n            (one batch of C episodes at a time)
  async, K      rollout_batch_size = C / (n (K + 1))  (the producer keeps (K + 1) * batch groups)
and trains the same number of samples. `--rollout-concurrency C` bounds the episodes running at
once in every mode; `--group-window G` lets async keep G x (K + 1) x batch groups in flight
(default 2, as `slimeish train`'s default `--async-groups`), so episode slots freed by a group's
short members go to other groups while its long member runs.

Throughput = trained samples / loop time, where loop time is the sum of the per-step times in
metrics.jsonl (time/rollout + time/train + time/sync): start-up, the final checkpoint and
logging are left out. The bound is what the work and the capacity allow:
  bound = min(C / (mean wait + mean chat turn), trained samples / sum(time/train + time/sync))
(mean wait by design, mean chat turn as measured by the agent in that run; the second term is
the trainer's own rate). The group-granular ceiling, C / (mean longest wait in a group of n +
chat turn), is the best a producer can do that holds a group's n slots until its slowest member
ends. Results and analysis: docs/benchmarks.md. Run:  .venv/bin/python -m bench.async_speedup
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.common.procs import ManagedProcess
from slimeish.train.metrics import read_metrics

AGENT = "bench.heavy_tail_agent.run"


@dataclass(frozen=True)
class Mode:
    name: str
    staleness: int | None  # None: sync

    def batch(self, capacity: int, n: int) -> int:
        """Groups per training step that keep `capacity` episodes in flight."""
        windows = 1 if self.staleness is None else self.staleness + 1
        per_batch = capacity // (n * windows)
        if per_batch * n * windows != capacity:
            raise ValueError(f"capacity {capacity} does not split into {self.name} batches of groups of {n}")
        return per_batch


MODES = {"sync": Mode("sync", None), "async-k1": Mode("async K=1", 1), "async-k2": Mode("async K=2", 2)}


def write_inputs(root: Path, n_prompts: int) -> tuple[Path, Path]:
    from slimeish.models.tiny import make_tiny_model

    model = make_tiny_model(root / "model")
    prompts = root / "prompts.jsonl"
    rows = [{"prompt": f"task {i}: say a word", "label": str(i)} for i in range(n_prompts)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model, prompts


def train_argv(
    args: argparse.Namespace, mode: Mode, model: Path, prompts: Path, run_dir: Path, buffer_url: str
) -> list[str]:
    batch = mode.batch(args.capacity, args.n)
    steps = args.samples // (batch * args.n)
    argv = [
        sys.executable, "-m", "slimeish", "train", "--model-path", str(model), "--run-dir", str(run_dir),
        "--prompt-data", str(prompts),
        "--rollout-function-path", "slimeish.rollout_functions.openai_agent.generate_rollout",
        "--agent-function-path", AGENT, "--rollout-batch-size", str(batch), "--n-samples-per-prompt", str(args.n),
        "--num-rollout", str(steps), "--rollout-concurrency", str(args.capacity), "--lr", "1e-5",
        "--buffer-url", buffer_url, "--run-id", run_dir.name,
    ]  # fmt: skip
    if mode.staleness is not None:
        argv += ["--mode", "async", "--max-staleness", str(mode.staleness)]
        argv += ["--async-groups", str(args.group_window * batch * (mode.staleness + 1))]
    return argv


def run_mode(args: argparse.Namespace, key: str, model: Path, prompts: Path, root: Path, buffer_url: str) -> dict:
    mode = MODES[key]
    run_dir = root / key
    episodes = root / f"{key}-episodes.jsonl"
    env = {
        "BENCH_BASE_DELAY": str(args.base_delay),
        "BENCH_TAIL_FACTOR": str(args.tail_factor),
        "BENCH_TAIL_PROB": str(args.tail_prob),
        "BENCH_SEED": str(args.seed),
        "BENCH_CHAT_AT": args.chat_at,
        "BENCH_EPISODE_LOG": str(episodes),
    }
    load_before = os.getloadavg()[0]
    t0 = time.time()
    log_path = root / f"{key}.log"
    argv = train_argv(args, mode, model, prompts, run_dir, buffer_url)
    with ManagedProcess(argv, log_path=log_path, env=env) as proc:
        try:
            rc = proc.proc.wait(args.timeout)
        except subprocess.TimeoutExpired:
            rc = "a timeout (hung)"
    if rc != 0:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"{key}: slimeish train ended with {rc} after {time.time() - t0:.0f} s\n{tail}")
    rows = read_metrics(run_dir)
    eps = [json.loads(x) for x in episodes.read_text().splitlines()]
    ledger = (run_dir / "trained_groups.jsonl").read_text().splitlines()
    trained = [g for line in ledger for g in json.loads(line)["groups"]]
    extra = {"load": (load_before, os.getloadavg()[0]), "wall": time.time() - t0}
    extra |= asyncio.run(buffer_counts(buffer_url, run_dir.name))
    return summarize(args, mode, rows, eps, trained) | extra


async def buffer_counts(buffer_url: str, run_id: str) -> dict:
    async with Buffer(buffer_url, run_id) as buffer:
        stats = await buffer.stats()
    return {
        "reopened": stats.groups_reopened,
        "regenerated": stats.members_regenerated,
        "dropped_stale": stats.groups_dropped_stale,
        "dropped_failed": stats.groups_dropped_failed,
    }


def nominal_delay(args: argparse.Namespace) -> tuple[float, float]:
    """Mean wait of one episode, and mean of the longest wait in a group of n, by design."""
    p, base, long = args.tail_prob, args.base_delay, args.base_delay * args.tail_factor
    all_short = (1 - p) ** args.n
    return (1 - p) * base + p * long, all_short * base + (1 - all_short) * long


def summarize(args: argparse.Namespace, mode: Mode, rows: list[dict], eps: list[dict], trained: list[str]) -> dict:
    steps = [r for r in rows if "rollout/samples" in r]
    samples = sum(r["rollout/samples"] for r in steps)
    loop_s = sum(r["time/rollout"] + r["time/train"] + r["time/sync"] for r in steps)
    trainer_s = sum(r["time/train"] + r["time/sync"] for r in steps)
    durations = [e["end"] - e["start"] for e in eps]
    # A regenerated member runs again under its (group, index): the last run is the one trained.
    members = {(e["group"], e["index"]): e for e in sorted(eps, key=lambda e: e["end"])}
    indices: dict[int, set[int]] = defaultdict(set)
    for group, index in members:
        indices[group].add(index)
    chat_s = statistics.fmean(e["chat_s"] for e in eps)
    mean_delay, mean_group_delay = nominal_delay(args)
    trained_eps = [members[(int(g.removeprefix("g")), i)] for g in trained for i in range(args.n)]
    return {
        "mode": mode.name,
        "batch": mode.batch(args.capacity, args.n),
        "steps": len(steps),
        "samples": samples,
        "loop_s": loop_s,
        "rate": samples / loop_s,
        "trainer_rate": samples / trainer_s,
        "t_rollout": statistics.fmean(r["time/rollout"] for r in steps),
        "t_train": statistics.fmean(r["time/train"] for r in steps),
        "t_sync": statistics.fmean(r["time/sync"] for r in steps),
        "episodes_run": len(eps),
        "mean_episode_s": statistics.fmean(durations),
        "long_trained": sum(e["delay"] > args.base_delay for e in trained_eps) / max(len(trained_eps), 1),
        "groups_done": sum(len(i) == args.n for i in indices.values()),
        "groups_trained": len(trained),
        "chat_s": chat_s,
        "staleness_max": max(r.get("rollout/staleness_max", 0.0) for r in steps),
        "busy": busy_episodes(eps),
        "bound": min(args.capacity / (mean_delay + chat_s), samples / trainer_s),
        "group_ceiling": args.capacity / (mean_group_delay + chat_s),
    }


def busy_episodes(eps: list[dict]) -> float:
    """Mean number of episodes running at once, from the first start to the last end."""
    if not eps:
        return 0.0
    span = max(e["end"] for e in eps) - min(e["start"] for e in eps)
    return sum(e["end"] - e["start"] for e in eps) / span


def report(args: argparse.Namespace, results: list[dict]) -> str:
    sync = next((r for r in results if r["mode"] == "sync"), None)
    head = (
        f"capacity C = {args.capacity} episodes at once, group size n = {args.n}, {args.samples} trained samples "
        f"per mode; wait {args.base_delay} s (p = {1 - args.tail_prob:.2f}) or {args.tail_factor:g} x that "
        f"(p = {args.tail_prob}); chat turn at the {args.chat_at} of the episode; async group window "
        f"{args.group_window} x (K+1) x batch; {os.cpu_count()} CPUs"
    )
    rows = [
        "| mode | batch (groups) | steps | samples/s | x sync | bound | % of bound | group-granular ceiling |",
        "|---|---|---|---|---|---|---|---|",
    ]
    diag = [
        "| mode | t_rollout / t_train / t_sync per step (s) | trainer-only samples/s | mean chat turn (s) "
        "| episodes busy (of C) | long episodes among trained | groups finished / trained / reopened / dropped stale "
        "| episodes run / stale members regenerated "
        "| staleness max "
        "| load 1-min before / after | wall incl. start-up (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        speedup = f"{r['rate'] / sync['rate']:.2f}" if sync else "-"
        rows.append(
            f"| {r['mode']} | {r['batch']} | {r['steps']} | {r['rate']:.2f} | {speedup} | {r['bound']:.1f} "
            f"| {100 * r['rate'] / r['bound']:.0f} % | {r['group_ceiling']:.1f} |"
        )
        diag.append(
            f"| {r['mode']} | {r['t_rollout']:.2f} / {r['t_train']:.2f} / {r['t_sync']:.2f} | {r['trainer_rate']:.0f} "
            f"| {r['chat_s']:.2f} | {r['busy']:.1f} | {100 * r['long_trained']:.0f} % "
            f"| {r['groups_done']} / {r['groups_trained']} / {r['reopened']} / {r['dropped_stale']} "
            f"| {r['episodes_run']} / {r['regenerated']} | {r['staleness_max']:.0f} "
            f"| {r['load'][0]:.1f} / {r['load'][1]:.1f} | {r['wall']:.0f} |"
        )
    return "\n".join([head, "", *rows, "", *diag])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--capacity", type=int, default=24, help="episodes allowed to run at once, every mode")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (group size)")
    parser.add_argument("--samples", type=int, default=576, help="trained samples per mode")
    parser.add_argument("--base-delay", type=float, default=0.25, help="seconds of a short episode's wait")
    parser.add_argument("--tail-factor", type=float, default=20.0, help="a long episode waits this many x base")
    parser.add_argument("--tail-prob", type=float, default=0.1, help="fraction of long episodes")
    parser.add_argument("--chat-at", choices=["end", "start"], default="end", help="chat turn after or before the wait")
    parser.add_argument(
        "--group-window", type=int, default=2,
        help="async: groups in flight = this x (K+1) x batch (slimeish train --async-groups); episodes stay <= C",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mode before it counts as hung")
    parser.add_argument("--keep", type=Path, help="keep run dirs and logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="async-speedup-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        model, prompts = write_inputs(root, n_prompts=512)
        results = []
        with EmbeddedServer(root / "buffer") as server:
            for key in args.modes:
                results.append(run_mode(args, key, model, prompts, root, server.url))
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(report(args, results))


if __name__ == "__main__":
    main()
