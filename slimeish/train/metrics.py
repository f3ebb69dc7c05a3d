"""Per-step metrics of a run: what the trained batch looked like, the router's counters, and
where they go (console line, `metrics.jsonl`, TensorBoard, `reward.png`)."""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from slimeish.common.sample import Sample

# Shown on the console line, in this order, when present; everything goes to JSONL/TensorBoard.
CONSOLE_KEYS = {
    "rollout/reward_mean": "reward",
    "eval/reward_mean": "eval_reward",
    "rollout/response_length": "resp_len",
    "train/loss": "loss",
    "train/rollout_kl": "kl",
    "router/tool_parse_failures": "parse_fail",
    "perf/sampled_tokens_per_s": "tok/s",
    "train/entropy": "entropy",
    "train/clip_fraction": "clipfrac",
    "time/rollout": "t_rollout",
    "time/train": "t_train",
    "time/sync": "t_sync",
}


def batch_metrics(samples: list[Sample], version: int) -> dict[str, float]:
    """What the trained batch looked like: rewards, lengths, staleness, capture splits."""
    if not samples:
        return {}
    rewards = [s.reward for s in samples if s.reward is not None]
    oldest = [min(s.weight_versions) for s in samples if s.weight_versions]
    splits = Counter(s.split_reason for s in samples if s.split_reason is not None)
    return {
        "rollout/reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "rollout/reward_std": statistics.pstdev(rewards) if rewards else 0.0,
        "rollout/response_length": sum(s.response_length for s in samples) / len(samples),
        "rollout/samples": float(len(samples)),
        "rollout/segments_split": float(sum(splits.values())),
        "rollout/staleness_max": float(version - min(oldest)) if oldest else 0.0,
        "rollout/sampled_tokens": float(sum(sum(s.loss_mask or []) for s in samples)),
    } | {f"rollout/segments_split/{reason}": float(n) for reason, n in splits.items()}


@contextlib.contextmanager
def timed(metrics: dict[str, Any], key: str) -> Iterator[None]:
    """Record the seconds the block took as `metrics[key]`."""
    t0 = time.perf_counter()
    yield
    metrics[key] = time.perf_counter() - t0


def prefixed(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    return {f"{prefix}/{k}": v for k, v in values.items()}


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """The rows of a run's `metrics.jsonl`, one per logged step (empty before the first)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def drop_steps_from(path: Path, step: int) -> None:
    """Keep only the lines of a per-step JSONL file whose "step" is below `step` (resume)."""
    if path.exists():
        lines = path.read_text().splitlines()
        path.write_text("".join(f"{x}\n" for x in lines if json.loads(x)["step"] < step))


# Prometheus sample name of a router counter -> the per-step metric that reports its increment.
# A labelled counter reports one metric per series, its label values appended as path parts
# (`router/parse_failures/<family>/<reason>`, `router/splits/<reason>`).
ROUTER_COUNTERS = {
    "router_tool_call_parse_failures_total": "router/tool_parse_failures",
    "router_turns_total": "router/turns",
    "router_bridged_turns_total": "router/bridged_turns",
    "router_tool_call_parse_failure_reasons_total": "router/parse_failures",
    "router_segments_total": "router/splits",
}
NOT_SPLITS = {"router/splits/first"}  # a session's first segment is counted there too, but splits nothing


def _metric_key(name: str, labels: dict[str, str]) -> str:
    return "/".join([ROUTER_COUNTERS[name], *labels.values()])


class RouterCounters:
    """Router counters (each router's Prometheus `/metrics`) as increments since the previous
    read, summed over the run's routers, so each step reports what the routers saw meanwhile:
    tool-call parse failures (by family and reason), segment splits by reason, captured and
    bridged turns."""

    def __init__(self, *router_urls: str):
        self.urls = [f"{url.rstrip('/')}/metrics" for url in router_urls]
        self._last = {url: _read_counters(url) for url in self.urls}

    def delta(self) -> dict[str, float]:
        """Each series' increment; a labelled series appears once a router has counted it."""
        out: dict[str, float] = {}
        for url in self.urls:
            for key, value in self._delta(url).items():
                out[key] = out.get(key, 0.0) + value
        return out

    def _delta(self, url: str) -> dict[str, float]:
        now = _read_counters(url)
        if now is None:  # the router is restarting: its counts of this step are left out
            return {}
        last = self._last[url] or {}
        # A counter below its last reading was reset by a router restart: count from zero.
        out = {key: value - (last.get(key, 0.0) if value >= last.get(key, 0.0) else 0.0) for key, value in now.items()}
        self._last[url] = now
        return out


def _read_counters(url: str) -> dict[str, float] | None:
    try:
        text = httpx.get(url, timeout=10).raise_for_status().text
    except httpx.HTTPError:
        return None
    samples = (s for family in text_string_to_metric_families(text) for s in family.samples)
    values = {_metric_key(s.name, s.labels): s.value for s in samples if s.name in ROUTER_COUNTERS}
    return {key: value for key, value in values.items() if key not in NOT_SPLITS}


class MetricsLogger:
    def __init__(self, run_dir: Path, *, tensorboard: bool = True, keep_before: int | None = None):
        """`keep_before`: on resume from step S, drop the rows of steps >= S that the stopped run
        logged past its last checkpoint, so the file and the curve describe one history."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.run_dir / "metrics.jsonl"
        if keep_before is not None:
            drop_steps_from(self.jsonl_path, keep_before)
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.run_dir / "tensorboard"))

    def log(self, step: int, metrics: dict[str, Any]) -> str:
        """Record one step; returns the console line (the caller prints it above its progress bar)."""
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        with self.jsonl_path.open("a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")
        if self._writer is not None:
            for key, value in clean.items():
                self._writer.add_scalar(key, value, step)
            self._writer.flush()
        shown = [f"{label}={clean[key]:.3g}" for key, label in CONSOLE_KEYS.items() if key in clean]
        return f"step {step}: " + " ".join(shown)

    def read(self) -> list[dict[str, float]]:
        return read_metrics(self.run_dir)

    def plot_rewards(self) -> Path | None:
        """Write `reward.png`: rollout reward per step and eval reward where measured."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.read()
        if not rows:
            return None
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key, label in (("rollout/reward_mean", "train rollouts"), ("eval/reward_mean", "held-out eval")):
            points = [(r["step"], r[key]) for r in rows if key in r]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=label)
        ax.set_xlabel("rollout step")
        ax.set_ylabel("mean reward")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = self.run_dir / "reward.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
