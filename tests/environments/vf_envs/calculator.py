"""Tool use: sums to compute with an `add` tool; the rubric checks the final answer."""

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def correct(completion, answer, **kwargs) -> float:
    return float(answer in (vf.Parser().parse_answer(completion) or ""))


def load_environment(**kwargs) -> vf.Environment:
    sums = [(a, b) for a in range(4) for b in (3, 7)]
    rows = [{"question": f"What is {a} + {b}? Use the add tool.", "answer": str(a + b)} for a, b in sums]
    return vf.ToolEnv(tools=[add], max_turns=3, dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[correct]))
