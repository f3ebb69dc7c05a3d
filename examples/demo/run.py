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
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import slimeish.train
from examples.demo.sft import SFTConfig, sft
from examples.demo.task import TaskConfig, write_datasets
from slimeish.common.config import add_dataclass_args, from_namespace, help_field
from slimeish.data import DataConfig
from slimeish.models.tiny import TinyModelConfig, make_tiny_model
from slimeish.rollout import RolloutConfig
from slimeish.rollout_functions.openai_agent import OpenAIAgentConfig
from slimeish.train import RunConfig, TrainSetup
from slimeish.train.metrics import read_metrics
from slimeish.trainer.config import LossConfig, TrainerConfig


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
    mode: Literal["sync", "async"] = help_field("sync", help="sync or async (see docs/cli.md)")
    fresh: bool = help_field(False, help="rebuild the data, the base model and the warm-start")
    lora_rank: int = help_field(
        0, help="train LoRA adapters of this rank on the frozen warm-start instead of all weights (0: full fine-tuning)"
    )
    lora_alpha: float = help_field(32.0, help="LoRA runs: adapters add (alpha / rank) * B A x")


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


def train_setup(cfg: DemoConfig, train: Path, eval_: Path, model: Path) -> TrainSetup:
    """The `slimeish train` recipe of the demo, as the typed configs `slimeish.train.run` takes."""
    return TrainSetup(
        run=RunConfig(
            run_dir=cfg.run_dir / "rl", mode=cfg.mode, num_rollout=cfg.num_rollout, eval_interval=cfg.eval_interval
        ),
        data=DataConfig(prompt_data=train, eval_prompt_data=eval_),
        rollout=RolloutConfig(
            rollout_function_path="slimeish.rollout_functions.openai_agent.generate_rollout",
            rollout_batch_size=cfg.rollout_batch_size,
            n_samples_per_prompt=cfg.n_samples_per_prompt,
            eval_temperature=0.0,  # greedy: the policy's choice; the train curve shows it sampled at T=1
        ),
        plugin=OpenAIAgentConfig(agent_function_path="examples.demo.agent.run_agent"),
        trainer=TrainerConfig(
            model_path=model,
            lr=cfg.lr,
            lr_warmup_steps=cfg.lr_warmup_steps,
            lr_decay_style="cosine",
            lr_decay_steps=max(cfg.num_rollout - cfg.lr_warmup_steps, 1),
            min_lr=cfg.min_lr,
            adam_beta2=0.98,
            clip_grad=1.0,
            lora_rank=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
        ),
        loss=LossConfig(kl_coef=cfg.kl_coef, kl_estimator="k3", loss_aggregation="sequence"),
    )


def summarize(run_dir: Path) -> None:
    rows = read_metrics(run_dir)
    evals = [(r["step"], r["eval/reward_mean"]) for r in rows if "eval/reward_mean" in r]
    if evals:
        curve = "  ".join(f"{step}:{value:.2f}" for step, value in evals)
        print(f"\nheld-out eval reward by step: {curve}")
        print(f"from {evals[0][1]:.2f} to {evals[-1][1]:.2f}; learning curve: {run_dir / 'reward.png'}")


def train_and_summarize(setup: TrainSetup) -> None:
    """`slimeish train` with `setup`, then its held-out curve."""
    if setup.run.checkpoint_to_load() is None:
        # Nothing to resume (the demo saves at its end): a run interrupted before that left its buffer
        # in the run dir, holding the group ids this run draws again, so it starts over.
        shutil.rmtree(setup.run.run_dir, ignore_errors=True)
    slimeish.train.run(setup)
    summarize(setup.run.run_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.demo.run", description=__doc__.split("\n\n")[0])
    add_dataclass_args(parser, DemoConfig, "demo")
    cfg = from_namespace(DemoConfig, parser.parse_args(argv))
    t0 = time.monotonic()
    train, eval_, model = prepare(cfg)
    setup = train_setup(cfg, train, eval_, model)
    train_and_summarize(setup)
    print(f"demo finished in {(time.monotonic() - t0) / 60:.1f} min")


if __name__ == "__main__":
    main()
