"""The demo, one command (`make demo`): an `openai`-SDK agent learns which tool to call, on CPU.

1. write the task's train and held-out eval prompts;
2. build a tiny Qwen2 model and tokenizer (`slimeish make-tiny-model`);
3. warm-start it with a short SFT on a sloppy teacher's transcripts: the tool-call format, and a
   habit of calling the inverse operation's tool (shown as such; it starts the reward near 0.2);
4. train it with GRPO through the full stack: the unmodified agent in `agent.py` talks to the
   router, which captures every token; finished episodes land in the Redis buffer; the Megatron
   trainer learns from whole groups and pushes weights back to the engine after every step.

Steps 1-3 are reused from an earlier run in the same run dir (`--fresh` redoes them).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from examples.demo.sft import SFTConfig, sft
from examples.demo.task import TaskConfig, write_datasets
from slimeish.common.config import add_dataclass_args, from_namespace, help_field
from slimeish.models.tiny import TinyModelConfig, make_tiny_model
from slimeish.run_metrics import read_metrics


@dataclass(kw_only=True)
class DemoConfig:
    run_dir: Path = help_field(Path("runs/demo"), help="where the data, models and the training run go")
    num_rollout: int = help_field(90, help="GRPO steps")
    rollout_batch_size: int = help_field(16, help="prompts per step")
    n_samples_per_prompt: int = help_field(8, help="episodes per prompt (the GRPO group)")
    lr: float = help_field(1.5e-3, help="peak learning rate of the RL phase (2e-3 breaks the tool-call format)")
    lr_warmup_steps: int = help_field(5, help="linear warm-up steps of the RL phase")
    min_lr: float = help_field(
        1.5e-4, help="learning rate at the end of the cosine decay (a constant rate destabilises the policy late)"
    )
    kl_coef: float = help_field(
        0.05, help="k3 KL penalty to the warm-start: keeps every operation's right tool possible to sample"
    )
    eval_interval: int = help_field(10, help="evaluate on the held-out prompts every N steps")
    mode: str = help_field("sync", help="sync or async (see docs/cli.md)")
    fresh: bool = help_field(False, help="rebuild the data, the base model and the warm-start")


def prepare(cfg: DemoConfig) -> tuple[Path, Path, Path]:
    """Data, base model and warm-started model, each reused when already there."""
    data_dir, base, warm = cfg.run_dir / "data", cfg.run_dir / "base", cfg.run_dir / "warm"
    if cfg.fresh or not (data_dir / "eval.jsonl").exists():
        write_datasets(data_dir, TaskConfig())
    if cfg.fresh or not (base / "config.json").exists():
        make_tiny_model(base, TinyModelConfig(arch="qwen2"))
    if cfg.fresh or not (warm / "config.json").exists():
        print("[warm-start] supervised fine-tune on a sloppy teacher (right tool 20 %, inverse tool 50 %): not RL")
        t0 = time.monotonic()
        sft(base, warm, SFTConfig(), TaskConfig())
        print(f"[warm-start] done in {time.monotonic() - t0:.0f}s -> {warm}")
    return data_dir / "train.jsonl", data_dir / "eval.jsonl", warm


def train_argv(cfg: DemoConfig, train: Path, eval_: Path, model: Path) -> list[str]:
    return [
        "--model-path", str(model),
        "--run-dir", str(cfg.run_dir / "rl"),
        "--prompt-data", str(train),
        "--eval-prompt-data", str(eval_),
        "--rollout-function-path", "slimeish.rollout_functions.openai_agent.generate_rollout",
        "--agent-function-path", "examples.demo.agent.run_agent",
        "--mode", cfg.mode,
        "--num-rollout", str(cfg.num_rollout),
        "--rollout-batch-size", str(cfg.rollout_batch_size),
        "--n-samples-per-prompt", str(cfg.n_samples_per_prompt),
        "--eval-interval", str(cfg.eval_interval),
        "--eval-temperature", "0",  # greedy: the policy's choice; the train curve shows it sampled at T=1
        "--lr", str(cfg.lr),
        "--lr-warmup-steps", str(cfg.lr_warmup_steps),
        "--lr-decay-style", "cosine",
        "--lr-decay-steps", str(max(cfg.num_rollout - cfg.lr_warmup_steps, 1)),
        "--min-lr", str(cfg.min_lr),
        "--kl-coef", str(cfg.kl_coef),
        "--kl-estimator", "k3",
        "--adam-beta2", "0.98",
        "--clip-grad", "1.0",
        "--loss-aggregation", "sequence",
    ]  # fmt: skip


def summarize(run_dir: Path) -> None:
    rows = read_metrics(run_dir)
    evals = [(r["step"], r["eval/reward_mean"]) for r in rows if "eval/reward_mean" in r]
    if evals:
        curve = "  ".join(f"{step}:{value:.2f}" for step, value in evals)
        print(f"\nheld-out eval reward by step: {curve}")
        print(f"from {evals[0][1]:.2f} to {evals[-1][1]:.2f}; learning curve: {run_dir / 'reward.png'}")


def main(argv: list[str] | None = None) -> None:
    from slimeish.train import main as train_main

    parser = argparse.ArgumentParser(prog="python -m examples.demo.run", description=__doc__.split("\n\n")[0])
    add_dataclass_args(parser, DemoConfig, "demo")
    cfg = from_namespace(DemoConfig, parser.parse_args(argv))
    t0 = time.monotonic()
    train, eval_, model = prepare(cfg)
    train_main(train_argv(cfg, train, eval_, model))
    summarize(cfg.run_dir / "rl")
    print(f"demo finished in {(time.monotonic() - t0) / 60:.1f} min")


if __name__ == "__main__":
    main()
