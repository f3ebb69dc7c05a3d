"""Procedurally generated arithmetic word problems with integer answers, written as JSONL.

No download: every problem comes from a handful of templates filled with random names, items
and numbers, so the task is endless, its labels are exact, and the difficulty is one knob
(`--max-value`). Train and eval sets share no question text. Each line is
`{"prompt": [{"role": "user", "content": ...}], "label": <int>, "metadata": {"template": ...}}`,
the chat-message prompt shape the default token-in rollout renders with the model's template.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slimeish.common.config import help_field
from slimeish.data import prompt_sets_main, write_prompt_sets

# Qwen2.5-Instruct's own math prompt convention; examples.math_sglang.reward reads \boxed{} first.
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jonas")
ITEMS = ("apple", "marble", "sticker", "book", "coin", "pencil", "cookie", "card")


@dataclass(kw_only=True)
class MathDataConfig:
    n_train: int = help_field(5000, help="training problems")
    n_eval: int = help_field(200, help="held-out eval problems (no question shared with train)")
    max_value: int = help_field(50, help="largest number drawn into a problem")
    data_seed: int = help_field(0, help="seed of the generator")


@dataclass(frozen=True)
class Problem:
    template: str
    question: str
    answer: int


def _buy_and_give(rng: random.Random, m: int) -> Problem:
    name, friend = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    a, b = rng.randint(2, m), rng.randint(2, m)
    c = rng.randint(1, a + b)
    q = f"{name} has {a} {item}s, buys {b} more, then gives {c} to {friend}. How many {item}s does {name} have now?"
    return Problem("buy_and_give", q, a + b - c)


def _boxes(rng: random.Random, m: int) -> Problem:
    item = rng.choice(ITEMS)
    a, b = rng.randint(2, m), rng.randint(2, 12)
    return Problem("boxes", f"A box holds {a} {item}s. How many {item}s are in {b} boxes?", a * b)


def _share(rng: random.Random, m: int) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    each, friends = rng.randint(2, m), rng.randint(2, 12)  # drawn as the quotient, so it divides exactly
    q = f"{name} shares {each * friends} {item}s equally among {friends} friends. How many does each friend get?"
    return Problem("share", q, each)


def _reading(rng: random.Random, m: int) -> Problem:
    name = rng.choice(NAMES)
    a, b, c = rng.randint(2, m), rng.randint(2, 9), rng.randint(1, m)
    q = f"{name} reads {a} pages a day for {b} days, then {c} more pages. How many pages did {name} read in total?"
    return Problem("reading", q, a * b + c)


def _shop(rng: random.Random, m: int) -> Problem:
    item = rng.choice(ITEMS)
    stock, sold_a, sold_b = rng.randint(10, 3 * m), rng.randint(1, m), rng.randint(1, m)
    stock = max(stock, sold_a + sold_b)
    q = (
        f"A shop has {stock} {item}s. It sells {sold_a} in the morning and {sold_b} in the afternoon. "
        f"How many {item}s are left?"
    )
    return Problem("shop", q, stock - sold_a - sold_b)


TEMPLATES: tuple[Callable[[random.Random, int], Problem], ...] = (_buy_and_give, _boxes, _share, _reading, _shop)


def make_splits(cfg: MathDataConfig) -> tuple[list[Problem], list[Problem]]:
    """Disjoint train and eval problems, deterministic in `cfg.data_seed`."""
    if cfg.max_value < 2:
        raise ValueError("--max-value must be at least 2")
    rng = random.Random(cfg.data_seed)
    eval_set: dict[str, Problem] = {}
    while len(eval_set) < cfg.n_eval:
        p = rng.choice(TEMPLATES)(rng, cfg.max_value)
        eval_set[p.question] = p
    train = []
    while len(train) < cfg.n_train:
        p = rng.choice(TEMPLATES)(rng, cfg.max_value)
        if p.question not in eval_set:
            train.append(p)
    return train, list(eval_set.values())


def to_record(problem: Problem) -> dict[str, Any]:
    content = f"{problem.question}\n{INSTRUCTION}"
    return {
        "prompt": [{"role": "user", "content": content}],
        "label": problem.answer,
        "metadata": {"template": problem.template},
    }


def write_datasets(out_dir: Path, cfg: MathDataConfig) -> tuple[Path, Path]:
    """Write `train.jsonl` and `eval.jsonl` to `out_dir`; returns their paths."""
    return write_prompt_sets(out_dir, make_splits(cfg), to_record)


if __name__ == "__main__":
    prompt_sets_main(
        MathDataConfig, write_datasets, title="data", description="Write arithmetic word problems as train/eval JSONL."
    )
