"""The math example's one command: GRPO on arithmetic word problems with the token-in rollout.

    # GPU node, SGLang servers already running (see README.md):
    python -m examples.math_sglang.run --engine-url http://127.0.0.1:30000 --model-path /models/Qwen2.5-0.5B-Instruct
    # anywhere else: the embedded CPU engine and a tiny model, two steps to show the loop runs
    python -m examples.math_sglang.run

It writes the prompt sets into the run dir, builds the run's `TrainSetup`, prints it as the
equivalent `slimeish train` command, and runs it with `slimeish.train.run`. Any flag not listed
by `--help` is a `slimeish train` flag applied over the example's own settings, so it wins (e.g.
`--lr 2e-6 --num-engines 2`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from examples.launch import model_or_tiny, run_example
from examples.math_sglang.data import MathDataConfig, write_datasets
from slimeish.common.config import help_field
from slimeish.data import DataConfig
from slimeish.rollout import RolloutConfig
from slimeish.train import RunConfig, TrainSetup, parse_args
from slimeish.train.launch import StackConfig, check_engine
from slimeish.trainer.config import LossConfig, TrainerConfig

REWARD = "examples.math_sglang.reward.reward"

# SGLang loads the exported HF checkpoint; the `tensor` fast path is the embedded engine's only.
WEIGHT_SYNC: Literal["disk"] = "disk"


def gpu_setup(run: RunConfig, data: DataConfig, model: Path, engine_url: list[str]) -> TrainSetup:
    """GRPO on SGLang: 32 prompts x 8 samples per step, one optimizer step per rollout step."""
    return TrainSetup(
        # SGLang refuses flush_cache while requests run in a paused batch, so sync weights between rollouts.
        run=replace(run, weight_sync=WEIGHT_SYNC, mode="sync", eval_interval=20, save_interval=50),
        data=data,
        rollout=RolloutConfig(
            custom_rm_path=REWARD,
            rollout_batch_size=32,
            n_samples_per_prompt=8,
            rollout_max_response_len=1024,
            rollout_temperature=1.0,
            rollout_concurrency=256,
        ),
        stack=StackConfig(engine_url=engine_url),
        # micro_batch_tokens bounds the fp32 logits of one micro-batch: 8192 x Qwen's 152k vocabulary is ~5 GB.
        trainer=TrainerConfig(
            model_path=model,
            device="cuda",
            dtype="bfloat16",
            lr=1e-6,
            weight_decay=0.1,
            clip_grad=1.0,
            micro_batch_tokens=8192,
        ),
        # SGLang's bf16 kernels and Megatron's disagree slightly: correct the off-policy gap (TIS).
        loss=LossConfig(advantage_estimator="grpo", eps_clip=0.2, eps_clip_high=0.28, kl_coef=0.0, tis=True),
    )


def cpu_setup(run: RunConfig, data: DataConfig, model: Path) -> TrainSetup:
    """The embedded CPU stack with a tiny random model: enough to watch every part run, not to learn."""
    return TrainSetup(
        run=run,
        data=data,
        rollout=RolloutConfig(
            custom_rm_path=REWARD, rollout_batch_size=2, n_samples_per_prompt=4, rollout_max_response_len=16
        ),
        trainer=TrainerConfig(model_path=model, device="cpu", lr=1e-5),
    )


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


def train_setup(cfg: MathRunConfig, extra: list[str]) -> TrainSetup:
    """The run: data and model, the preset, then the user's `slimeish train` flags, which win."""
    if cfg.engine_url and cfg.model_path is None:
        raise SystemExit("--model-path is required with --engine-url: the checkpoint the SGLang servers serve")
    run_dir = cfg.run_dir.resolve()  # absolute: SGLang loads the exported weights by this path
    train_jsonl, eval_jsonl = write_datasets(run_dir / "data", _data_config(cfg))
    gpu = bool(cfg.engine_url)
    run = RunConfig(run_dir=run_dir, num_rollout=cfg.num_rollout or (200 if gpu else 2))
    data = DataConfig(prompt_data=train_jsonl, eval_prompt_data=eval_jsonl, metadata_key="metadata")
    model = model_or_tiny(cfg.model_path, run_dir)
    preset = gpu_setup(run, data, model, cfg.engine_url) if gpu else cpu_setup(run, data, model)
    return parse_args(extra, base=preset)


def _data_config(cfg: MathRunConfig) -> MathDataConfig:
    return MathDataConfig() if cfg.engine_url else MathDataConfig(n_train=64, n_eval=2)


def main(argv: list[str] | None = None) -> None:
    description = __doc__.split("\n\n")[0]
    run_example(MathRunConfig, train_setup, description, argv, check=lambda cfg: check_engines(cfg.engine_url))


if __name__ == "__main__":
    main()
