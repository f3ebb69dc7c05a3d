"""The demo's agent: plain `openai` SDK code with a tool loop, unaware of any training.

It asks the question with the four tools attached, runs every tool call the model makes, sends
the results back as `role: tool` messages, and scores the final answer. Pointed at slimeish's
router (through a session's base_url) its turns become training data; pointed at any other
OpenAI-compatible server it is just an agent:

    python -m examples.demo.agent --base-url http://localhost:8000/v1 --api-key KEY --question "What is 6 times 7?"
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import openai

from examples.demo.task import TOOLS, Problem, call_tool, format_tool_result, reward

MAX_TURNS = 3  # one tool call and one answer are enough; more is a loop that will not score
MAX_TOKENS = 40  # the longest correct turn is about 30 tokens


async def solve(
    client: openai.AsyncOpenAI, question: str, model: str = "default", temperature: float | None = None
) -> str | None:
    """Answer `question`, running the tools the model calls; returns the final text.

    Without `temperature` the server's default applies (for a training session, the router's).
    """
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    for _ in range(MAX_TURNS):
        completion = await client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            max_tokens=MAX_TOKENS,
            temperature=openai.omit if temperature is None else temperature,
        )
        message = completion.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        messages += [
            {"role": "tool", "tool_call_id": call.id, "content": run_tool_call(call)} for call in message.tool_calls
        ]
    return None


def run_tool_call(call: Any) -> str:
    """The tool's result as text, or an error message the model sees instead (never raises)."""
    try:
        return format_tool_result(call_tool(call.function.name, json.loads(call.function.arguments)))
    except (ValueError, TypeError, AttributeError) as exc:  # json.JSONDecodeError is a ValueError
        return f"error: {exc}"


async def run_agent(client: openai.AsyncOpenAI, sample: Any) -> float:
    """The rollout hook: answer `sample.prompt` and return 1.0 iff the answer equals `sample.label`."""
    return reward(await solve(client, sample.prompt), sample.label)


async def _main(args: argparse.Namespace) -> None:
    async with openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key) as client:
        answer = await solve(client, args.question, model=args.model, temperature=args.temperature)
    print(answer)
    problem = _parse_question(args.question)
    if problem is not None:
        print(f"reward {reward(answer, problem.label)}")


def _parse_question(question: str) -> Problem | None:
    """The Problem behind a demo question, to score it; None for free-form questions."""
    for op in ("divided by", "plus", "minus", "times"):
        head, sep, tail = question.removeprefix("What is ").removesuffix("?").partition(f" {op} ")
        if sep and head.isdigit() and tail.isdigit():
            return Problem(op, int(head), int(tail))
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the demo agent against an OpenAI-compatible server.")
    parser.add_argument("--base-url", required=True, help="e.g. a router session's base_url")
    parser.add_argument("--api-key", default="none", help="API key (a router session's key)")
    parser.add_argument("--model", default="default", help="model name sent in the request")
    parser.add_argument("--question", default="What is 17 plus 25?", help="the question to answer")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (server default)")
    asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
