"""The math example's one command: GRPO on arithmetic word problems with the token-in rollout.

    # GPU node, SGLang servers already running (see README.md):
    python -m examples.math_sglang.run --engine-url http://127.0.0.1:30000 --model-path /models/Qwen2.5-0.5B-Instruct
    # anywhere else: the embedded CPU engine and a tiny model, two steps to show the loop runs
    python -m examples.math_sglang.run

It writes the prompt sets into the run dir, prints the `slimeish train` command it runs, and
runs it. Any flag not listed by `--help` goes to `slimeish train` unchanged, after the
example's own settings, so it wins (e.g. `--lr 2e-6 --num-engines 2`).
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from pathlib import Path

from examples.math_sglang.data import MathDataConfig, write_datasets
from slimeish import train
from slimeish.common.config import add_dataclass_args, from_namespace, help_field
from slimeish.launch import check_engine

REWARD = "examples.math_sglang.reward.reward"

# SGLang loads the exported HF checkpoint; the `tensor` fast path is the embedded engine's only.
WEIGHT_SYNC = "disk"
# GRPO on SGLang: 32 prompts x 8 samples per step, one optimizer step per rollout step.
GPU_ARGS = [
    "--device", "cuda", "--dtype", "bfloat16",
    "--weight-sync", WEIGHT_SYNC,
    # SGLang refuses flush_cache while requests run in a paused batch, so sync weights between rollouts.
    "--mode", "sync",
    "--rollout-batch-size", "32", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "1024",
    "--rollout-temperature", "1.0", "--rollout-concurrency", "256",
    "--lr", "1e-6", "--weight-decay", "0.1", "--clip-grad", "1.0",
    "--advantage-estimator", "grpo", "--eps-clip", "0.2", "--eps-clip-high", "0.28", "--kl-coef", "0",
    # SGLang's bf16 kernels and Megatron's disagree slightly: correct the off-policy gap (TIS).
    "--tis", "--eval-interval", "20", "--save-interval", "50",
    # Bounds the fp32 logits of one micro-batch: 8192 tokens x Qwen's 152k vocabulary is ~5 GB.
    "--micro-batch-tokens", "8192",
]  # fmt: skip
# The embedded CPU stack with a tiny random model: enough to watch every part run, not to learn.
CPU_ARGS = [
    "--device", "cpu", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
    "--rollout-max-response-len", "16", "--lr", "1e-5",
]  # fmt: skip


@dataclass(kw_only=True)
class MathRunConfig:
    engine_url: list[str] = help_field(
        [], help="running SGLang server URL(s) (repeatable); none: the embedded CPU engine with a tiny model"
    )
    model_path: Path | None = help_field(
        None, help="HF checkpoint the SGLang servers serve (required with --engine-url; default: a tiny model)"
    )
    run_dir: Path = help_field(Path("runs/math_sglang"), help="data, logs, metrics, checkpoints, exported weights")
    num_rollout: int | None = help_field(None, help="rollout steps (default: 200 with --engine-url, 2 without)")


def check_engines(urls: list[str]) -> None:
    """Fail before the data is written if an engine is down or cannot take this preset's weight sync."""
    for url in urls:
        try:
            check_engine(url, WEIGHT_SYNC)
        except ValueError as exc:
            raise SystemExit(str(exc)) from exc


def train_argv(cfg: MathRunConfig, extra: list[str]) -> list[str]:
    """The `slimeish train` arguments: data and model first, then the preset, then the user's flags."""
    run_dir = cfg.run_dir.resolve()  # absolute: SGLang loads the exported weights by this path
    train_jsonl, eval_jsonl = write_datasets(run_dir / "data", _data_config(cfg))
    gpu = bool(cfg.engine_url)
    steps = cfg.num_rollout or (200 if gpu else 2)
    argv = ["--run-dir", str(run_dir), "--model-path", str(_model_path(cfg, run_dir))]
    argv += ["--prompt-data", str(train_jsonl), "--eval-prompt-data", str(eval_jsonl)]
    argv += ["--metadata-key", "metadata", "--custom-rm-path", REWARD, "--num-rollout", str(steps)]
    if gpu:
        argv += ["--engine-url", *cfg.engine_url]
    return argv + (GPU_ARGS if gpu else CPU_ARGS) + extra


def _data_config(cfg: MathRunConfig) -> MathDataConfig:
    return MathDataConfig() if cfg.engine_url else MathDataConfig(n_train=64, n_eval=2)


def _model_path(cfg: MathRunConfig, run_dir: Path) -> Path:
    if cfg.model_path is not None:
        return cfg.model_path.resolve()
    if cfg.engine_url:
        raise SystemExit("--model-path is required with --engine-url: the checkpoint the SGLang servers serve")
    from slimeish.models.tiny import ensure_tiny_model

    return ensure_tiny_model(run_dir / "tiny-model")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dataclass_args(parser, MathRunConfig, "example")
    ns, extra = parser.parse_known_args(argv)
    cfg = from_namespace(MathRunConfig, ns)
    if cfg.engine_url:
        check_engines(cfg.engine_url)
    args = train_argv(cfg, extra)
    print("slimeish train " + shlex.join(args), flush=True)
    train.main(args)


if __name__ == "__main__":
    main()
