"""The demo task: arithmetic questions that need exactly one tool call.

"What is 7 plus 5?" has to be answered by calling one of four tools (`add`, `sub`, `mul`, `div`)
with the two numbers, reading the tool result, and answering "The answer is 12.". The SFT
warm-start teaches that *format* with the tool picked uniformly at random, so the warm-started
policy is right about 1/4 of the time; GRPO has to learn which tool the question word asks for.
That makes the start (≈ 0.25) and the goal (≥ 0.8) honest: the reward can only rise by learning
the mapping from word to tool.

Everything is kept small for a tiny model on a 2-core CPU: operands are single digits (a short,
fixed layout makes copying them into the call quick to learn in the warm-start), tool names are
short calculator names, and the tool schemas carry no descriptions (the chat template lists them
in every prompt, so they cost tokens on every turn).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slimeish.common.config import help_field
from slimeish.data import prompt_sets_main, write_prompt_sets

# question word -> tool name; the policy must learn this mapping.
OPS: dict[str, str] = {"plus": "add", "minus": "sub", "times": "mul", "divided by": "div"}
TOOL_NAMES = tuple(OPS.values())
INPUT_KEY = "prompt"
LABEL_KEY = "label"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
    for name in TOOL_NAMES
]

_ANSWER_RE = re.compile(r"^\s*The answer is (-?\d+(?:\.\d+)?)\.\s*$")


@dataclass(kw_only=True)
class TaskConfig:
    n_train: int = help_field(2000, help="training prompts")
    n_eval: int = help_field(64, help="held-out eval prompts (no (op, a, b) shared with train)")
    max_operand: int = help_field(9, help="operands (and quotients) are drawn from 2..max_operand")
    data_seed: int = help_field(0, help="seed for the prompt sets")


@dataclass(frozen=True)
class Problem:
    op: str  # question word, a key of OPS
    a: int
    b: int

    @property
    def tool(self) -> str:
        return OPS[self.op]

    @property
    def question(self) -> str:
        return f"What is {self.a} {self.op} {self.b}?"

    @property
    def label(self) -> int:
        return int(call_tool(self.tool, {"a": self.a, "b": self.b}))


def call_tool(name: str, arguments: dict[str, Any]) -> int | float:
    """Run one demo tool; ValueError for an unknown tool or bad arguments (the agent reports it)."""
    if name not in TOOL_NAMES:
        raise ValueError(f"unknown tool {name!r}; tools are {', '.join(TOOL_NAMES)}")
    a, b = arguments.get("a"), arguments.get("b")
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b)):
        raise ValueError(f"tool {name} needs numeric arguments a and b, got {arguments!r}")
    if name == "add":
        return a + b
    if name == "sub":
        return a - b
    if name == "mul":
        return a * b
    if b == 0:
        raise ValueError("division by zero")
    quotient = a / b
    return int(quotient) if quotient == int(quotient) else round(quotient, 2)


def format_tool_result(value: int | float) -> str:
    return str(value)


def format_answer(value: int | float) -> str:
    return f"The answer is {value}."


def parse_answer(text: str | None) -> float | None:
    """The number in a final answer "The answer is N.", or None if the text has another shape."""
    match = _ANSWER_RE.match(text or "")
    return float(match.group(1)) if match else None


def reward(final_text: str | None, label: int | float) -> float:
    """1.0 when the final answer is exactly the label, else 0.0 (malformed answers included)."""
    answer = parse_answer(final_text)
    return 1.0 if answer is not None and answer == float(label) else 0.0


def random_problem(rng: random.Random, max_operand: int) -> Problem:
    op = rng.choice(list(OPS))
    if op == "divided by":  # exact quotients, so the correct tool always gives an integer
        b = rng.randint(2, max_operand)
        return Problem(op, b * rng.randint(2, max_operand), b)
    a, b = rng.randint(2, max_operand), rng.randint(2, max_operand)
    if op == "minus":
        a, b = max(a, b), min(a, b)
    return Problem(op, a, b)


def make_splits(cfg: TaskConfig) -> tuple[list[Problem], list[Problem]]:
    """Disjoint train and eval problems, deterministic in `cfg.data_seed`."""
    rng = random.Random(cfg.data_seed)
    eval_set: dict[Problem, None] = {}
    while len(eval_set) < cfg.n_eval:
        eval_set[random_problem(rng, cfg.max_operand)] = None
    train = []
    while len(train) < cfg.n_train:
        problem = random_problem(rng, cfg.max_operand)
        if problem not in eval_set:
            train.append(problem)
    return train, list(eval_set)


def to_record(problem: Problem) -> dict[str, Any]:
    return {
        INPUT_KEY: problem.question,
        LABEL_KEY: problem.label,
        "metadata": {"op": problem.op, "a": problem.a, "b": problem.b},
    }


def write_datasets(out_dir: Path, cfg: TaskConfig) -> tuple[Path, Path]:
    """Write `train.jsonl` and `eval.jsonl` (keys `prompt`, `label`, `metadata`) to `out_dir`."""
    return write_prompt_sets(out_dir, make_splits(cfg), to_record)


if __name__ == "__main__":
    prompt_sets_main(
        TaskConfig, write_datasets, title="task", description="Write the demo's train/eval prompt sets as JSONL."
    )
