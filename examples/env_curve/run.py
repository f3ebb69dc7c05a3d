"""A learning curve on another project's environment: reasoning-gym's `spell_backward`, unmodified.

1. write disjoint train and held-out prompt sets from reasoning-gym's own generator (3-letter words
   in its easiest setting; a held-out word is never a train word);
2. build the tiny Qwen2 model and tokenizer (`slimeish make-tiny-model`);
3. warm-start it as the demo does (`examples.demo.sft.fine_tune`): a short SFT on a *sloppy
   teacher* that answers in reasoning-gym's `<answer>` format but spells the word backward only
   `--teacher-right` of the time and copies it forward otherwise, so greedy decoding starts by
   copying (reasoning-gym's partial credit: the letters that happen to sit in place);
4. train it with the demo's GRPO recipe through `slimeish train` and the reasoning-gym adapter
   (`slimeish.rollout_functions.reasoning_gym_env`): reasoning-gym's `extract_answer` and the task's
   own `score_answer` give the reward; the held-out reward (greedy) is measured every
   `--eval-interval` steps.

Steps 1-3 are reused from an earlier run in the same run dir (`--fresh` redoes them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.demo.run import DemoConfig, train_and_summarize, train_setup
from examples.demo.sft import FineTuneConfig, collate, fine_tune, is_short_step, render_with_mask
from slimeish.common.config import add_dataclass_args, from_namespace, help_field
from slimeish.data import write_prompts
from slimeish.models.tiny import TinyModelConfig, make_tiny_model
from slimeish.rollout_functions.reasoning_gym_env import ReasoningGym, ReasoningGymConfig
from slimeish.train import TrainSetup

ENV_ID = "spell_backward"
ADAPTER = "slimeish.rollout_functions.reasoning_gym_env.generate_rollout"


@dataclass(kw_only=True)
class EnvCurveConfig(DemoConfig):
    run_dir: Path = help_field(Path("runs/env-curve"), help="where the data, models and the training run go")
    num_rollout: int = help_field(30, help="GRPO steps")
    eval_interval: int = help_field(5, help="evaluate on the held-out prompts every N steps")
    word_len: int = help_field(3, help="reasoning-gym's min_word_len = max_word_len: the task's difficulty")
    n_train: int = help_field(1000, help="train prompts drawn from the generator")
    n_eval: int = help_field(64, help="held-out prompts (words not among the train prompts')")
    response_len: int = help_field(16, help="max new tokens of an answer (`<answer>abc</answer>` is ~9)")
    sft_short_steps: int = help_field(
        500, help="warm-start phase 1: steps on transcripts without reasoning-gym's system prompt (41 tokens, not 240)"
    )
    sft_steps: int = help_field(300, help="warm-start phase 2: steps alternating full transcripts and short ones")
    sft_batch_size: int = help_field(48, help="warm-start short transcripts per step (full ones: half as many)")
    sft_lr: float = help_field(4e-3, help="warm-start peak learning rate")
    sft_threads: int = help_field(
        1, help="warm-start torch CPU threads (on a loaded machine 2 threads ran a step ~30x slower than 1)"
    )
    teacher_right: float = help_field(0.4, help="how often the teacher spells the word backward (else forward)")
    seed: int = help_field(0, help="seed of the prompt sets, the teacher's choices and the warm-start")

    def env_args(self) -> dict[str, Any]:
        return {"min_word_len": self.word_len, "max_word_len": self.word_len}


def write_data(data_dir: Path, cfg: EnvCurveConfig) -> tuple[Path, Path]:
    """Train and held-out records from the generator; held-out prompts whose word is a train word are
    dropped (the generator draws words with replacement, from another seed range for eval)."""
    adapter = ReasoningGym(ENV_ID, cfg.env_args())
    train = adapter.records(cfg.n_train, cfg.seed, "train")
    seen = {r["label"]["metadata"]["word"].lower() for r in train}
    held_out = [
        r
        for r in adapter.records(8 * cfg.n_eval, cfg.seed, "eval")
        if r["label"]["metadata"]["word"].lower() not in seen
    ]
    if len(held_out) < cfg.n_eval:
        raise ValueError(f"only {len(held_out)} held-out words are not train words: lower --n-train or --n-eval")
    paths = data_dir / "train.jsonl", data_dir / "eval.jsonl"
    for path, records in zip(paths, (train, held_out[: cfg.n_eval]), strict=True):
        write_prompts(path, records)
    return paths


def teacher_messages(record: dict[str, Any], rng: random.Random, teacher_right: float) -> list[dict[str, Any]]:
    """The prompt and the sloppy teacher's reply in reasoning-gym's answer format: the word spelled
    backward (right) with probability `teacher_right`, else copied forward (the habit RL must undo)."""
    word = record["label"]["metadata"]["word"]
    answer = word[::-1] if rng.random() < teacher_right else word
    return [*record["prompt"], {"role": "assistant", "content": f"<answer>{answer}</answer>"}]


def warm_start(base: Path, warm: Path, train: Path, cfg: EnvCurveConfig) -> Path:
    records = [json.loads(line) for line in train.read_text().splitlines()]
    rng = random.Random(cfg.seed)

    def batch(tokenizer: Any, step: int) -> tuple[Any, str]:
        # as the demo's warm-start: the copying is learned cheaply on short transcripts (here without
        # the environment's long system prompt), then kept while it learns to look past that prompt
        short = is_short_step(step, cfg.sft_short_steps)
        size = cfg.sft_batch_size if short else max(cfg.sft_batch_size // 2, 1)
        chats = [teacher_messages(rng.choice(records), rng, cfg.teacher_right) for _ in range(size)]
        if short:
            chats = [[m for m in chat if m["role"] != "system"] for chat in chats]
        rows = [render_with_mask(tokenizer, chat, tools=None) for chat in chats]
        return collate(tokenizer, rows), "short" if short else "full"

    total = cfg.sft_short_steps + cfg.sft_steps
    return fine_tune(base, warm, FineTuneConfig(lr=cfg.sft_lr, seed=cfg.seed, threads=cfg.sft_threads), total, batch)


def prepare(cfg: EnvCurveConfig) -> tuple[Path, Path, Path]:
    """Data, base model and warm-started model, each reused when already there."""
    data_dir, base, warm = cfg.run_dir / "data", cfg.run_dir / "base", cfg.run_dir / "warm"
    if cfg.fresh or not (data_dir / "eval.jsonl").exists():
        write_data(data_dir, cfg)
    if cfg.fresh or not (base / "config.json").exists():
        make_tiny_model(base, TinyModelConfig(arch="qwen2"))
    if cfg.fresh or not (warm / "config.json").exists():
        print(f"[warm-start] SFT on a sloppy teacher (backward {cfg.teacher_right:.0%}, else forward): not RL")
        t0 = time.monotonic()
        warm_start(base, warm, data_dir / "train.jsonl", cfg)
        print(f"[warm-start] done in {time.monotonic() - t0:.0f}s -> {warm}")
    return data_dir / "train.jsonl", data_dir / "eval.jsonl", warm


def env_train_setup(cfg: EnvCurveConfig, train: Path, eval_: Path, model: Path) -> TrainSetup:
    """The demo's `slimeish train` recipe with the reasoning-gym adapter in place of the demo's agent."""
    setup = train_setup(cfg, train, eval_, model)
    rollout = dataclasses.replace(
        setup.rollout, rollout_function_path=ADAPTER, rollout_max_response_len=cfg.response_len
    )
    return dataclasses.replace(
        setup, rollout=rollout, plugin=ReasoningGymConfig(env_id=ENV_ID, env_args=cfg.env_args())
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.env_curve.run", description=__doc__.split("\n\n")[0])
    add_dataclass_args(parser, EnvCurveConfig, "env curve")
    cfg = from_namespace(EnvCurveConfig, parser.parse_args(argv))
    t0 = time.monotonic()
    train, eval_, model = prepare(cfg)
    setup = env_train_setup(cfg, train, eval_, model)
    train_and_summarize(setup)
    print(f"finished in {(time.monotonic() - t0) / 60:.1f} min")


if __name__ == "__main__":
    main()
