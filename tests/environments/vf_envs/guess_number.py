"""Multi-turn: guess a digit in three tries, told "higher" or "lower" after each wrong guess."""

import re

import verifiers as vf
from datasets import Dataset


class GuessEnv(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        guess = re.findall(r"\d", vf.Parser().parse_answer(messages) or "")
        target = int(state["answer"])
        if not guess:
            return [vf.UserMessage(content="Say one digit.")]
        hint = "correct" if int(guess[-1]) == target else "higher" if int(guess[-1]) < target else "lower"
        return [vf.UserMessage(content=hint)]


def found(completion, answer, **kwargs) -> float:
    guesses = [re.findall(r"\d", str(m.get("content") or "")) for m in completion if m.get("role") == "assistant"]
    return float(any(g and g[-1] == answer for g in guesses))


def load_environment(**kwargs) -> vf.Environment:
    rows = [{"question": "I think of a digit from 0 to 9. Guess it.", "answer": str(d)} for d in range(10)]
    return GuessEnv(dataset=Dataset.from_list(rows), max_turns=3, rubric=vf.Rubric(funcs=[found]))
