"""Single turn: reverse a word; the rubric gives partial credit by the longest common prefix."""

import verifiers as vf
from datasets import Dataset

WORDS = "apple banana cherry grape lemon mango olive peach plum kiwi melon berry".split()


def prefix_score(completion, answer, **kwargs) -> float:
    text = (vf.Parser().parse_answer(completion) or "").strip()
    n = next((i for i, (a, b) in enumerate(zip(text, answer, strict=False)) if a != b), min(len(text), len(answer)))
    return n / len(answer)


def load_environment(**kwargs) -> vf.Environment:
    rows = [{"question": f"Reverse the word: {w}", "answer": w[::-1]} for w in WORDS]
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(rows[:8]), eval_dataset=Dataset.from_list(rows[8:]),
        system_prompt="Answer with the reversed word only.", rubric=vf.Rubric(funcs=[prefix_score]),
    )  # fmt: skip
