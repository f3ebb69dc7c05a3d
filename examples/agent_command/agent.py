"""An agent that does not know it is being trained: plain `openai` SDK code, one run per episode.

`slimeish.rollout_functions.agent_command` starts it with `OPENAI_BASE_URL` / `OPENAI_API_KEY` pointing at
the episode's router session, and `SLIMEISH_PROMPT` / `SLIMEISH_LABEL` (JSON) describing the task.
Against any other OpenAI-compatible server it runs the same way. Two turns:

1. the task (a string or a list of chat messages) -> the model works it out;
2. "Check your work. Reply with only the final number." -> the model commits to a number.

The last stdout line is `{"reward": x}`: 1.0 when that number equals the label, 0.1 for another
number (the format was followed), 0.0 for no number. With `--answer-only` it prints
`{"answer": "<second reply>"}` instead and leaves the scoring to `verifier.py`.
Only the standard library and `openai` are used, so the script can be copied anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import re

from openai import OpenAI

FOLLOW_UP = "Check your work. Reply with only the final number."
_NUMBER = re.compile(r"(?:(?<![\w.])-)?\d+(?:\.\d+)?")


def last_number(text: str | None) -> float | None:
    numbers = _NUMBER.findall((text or "").replace(",", ""))
    return float(numbers[-1]) if numbers else None


def score(answer: str | None, label: object) -> float:
    number = last_number(answer)
    if number is None:
        return 0.0
    return 1.0 if label is not None and number == float(label) else 0.1


def converse(client: OpenAI, prompt: str | list[dict], *, max_tokens: int, temperature: float) -> str:
    """Run the two turns; returns the model's second (final) reply."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    for follow_up in (None, FOLLOW_UP):
        if follow_up is not None:
            messages.append({"role": "user", "content": follow_up})
        reply = client.chat.completions.create(
            model=os.environ.get("OPENAI_MODEL", "policy"),  # the router serves one model and ignores the name
            messages=messages,
            max_tokens=max_tokens,
            temperature=temperature,
        )
        content = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": content})
    return content


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=512, help="new tokens per reply")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (RL explores)")
    parser.add_argument("--answer-only", action="store_true", help='print {"answer": ...}, let a verifier score')
    args = parser.parse_args(argv)
    prompt = json.loads(os.environ["SLIMEISH_PROMPT"])
    client = OpenAI()  # reads OPENAI_BASE_URL and OPENAI_API_KEY
    answer = converse(client, prompt, max_tokens=args.max_tokens, temperature=args.temperature)
    if args.answer_only:
        print(json.dumps({"answer": answer}))
    else:
        print(json.dumps({"reward": score(answer, json.loads(os.environ.get("SLIMEISH_LABEL", "null")))}))


if __name__ == "__main__":
    main()
