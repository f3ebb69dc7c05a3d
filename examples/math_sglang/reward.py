"""Reward for the math task: 1.0 when the final number of the response equals the label.

"The final number" is read in order of how explicitly the model stated it: the last
`\\boxed{...}` (the format the prompt asks for), else the number after the last "answer is" /
"answer:", else the last number in the text. Thousands separators (`1,234`), a currency sign,
a trailing `.0` and the Unicode minus are accepted; a minus sign glued to a preceding word or
digit (`12-5`) is read as an operator, not a sign.
"""

from __future__ import annotations

import re
from typing import Any

from slimeish.common.sample import Sample

_NUMBER = re.compile(r"(?:(?<![\w.])-)?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)", re.IGNORECASE)
_BOXED = "\\boxed"


def _to_float(token: str) -> float:
    return float(token.replace("$", "").replace(",", ""))


def _boxed_contents(text: str) -> str | None:
    """The inside of the last \\boxed{...}, braces matched (so \\boxed{\\text{12}} works)."""
    start = text.rfind(_BOXED + "{")
    if start < 0:
        return None
    depth, i = 0, start + len(_BOXED)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None  # unclosed (cut off inside the box): the other rules decide


def final_number(text: str | None) -> float | None:
    """The number the response gives as its final answer, or None when it states none."""
    if not text:
        return None
    text = text.replace("\u2212", "-")
    boxed = _boxed_contents(text)
    if boxed is not None:
        numbers = _NUMBER.findall(boxed)
        return _to_float(numbers[-1]) if numbers else None
    answers = list(_ANSWER_IS.finditer(text))
    if answers:
        after = _NUMBER.search(text, answers[-1].end())
        if after:
            return _to_float(after.group())
    numbers = _NUMBER.findall(text)
    return _to_float(numbers[-1]) if numbers else None


def score(text: str | None, label: Any) -> float:
    """1.0 if the final number equals the (integer) label, else 0.0."""
    answer = final_number(text)
    return 1.0 if answer is not None and answer == float(label) else 0.0


async def reward(args: Any, sample: Sample) -> float:
    """`--custom-rm-path examples.math_sglang.reward.reward`: score the sampled response text."""
    return score(sample.response, sample.label)
