"""A small coding agent: plain `openai` SDK code with one `bash` tool, run once per episode.

The harness starts it inside the episode's sandbox (working directory: the task's workspace) with
`OPENAI_BASE_URL` / `OPENAI_API_KEY` pointing at the episode's router session and the task in
`SLIMEISH_INSTRUCTION`. It loops: ask the model, run each `bash` tool call in the workspace, send
the results back, until the model answers without a tool call or `--max-turns` is reached. It
knows nothing of rewards: the task's tests grade what it leaves in the workspace. Only the
standard library and `openai` are used, so it can stand for any agent program.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess

from openai import OpenAI

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command in the task's working directory; returns its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the command line"}},
            "required": ["command"],
        },
    },
}
SYSTEM = "You are a coding agent. Use the bash tool to inspect and change files. Reply without a tool call when done."
OUTPUT_LIMIT = 4000  # characters of a command's output sent back to the model


def run_bash(arguments: str, timeout_s: float) -> str:
    try:
        command = json.loads(arguments)["command"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return 'error: the arguments must be a JSON object {"command": "..."}'
    try:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"error: the command ran past {timeout_s:g} s"
    return f"exit code {done.returncode}\n{done.stdout}{done.stderr}"[-OUTPUT_LIMIT:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-turns", type=int, default=4, help="model calls at most")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per model call")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--command-timeout", type=float, default=30.0, help="seconds per bash command")
    args = parser.parse_args()
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY: the episode's router session
    messages: list = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": os.environ["SLIMEISH_INSTRUCTION"]},
    ]
    for _ in range(args.max_turns):
        reply = client.chat.completions.create(
            model=os.environ.get("OPENAI_MODEL", "policy"),  # the router serves one model and ignores the name
            messages=messages,
            tools=[BASH_TOOL],
            max_tokens=args.max_tokens,
            temperature=args.temperature,
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            output = run_bash(call.function.arguments, args.command_timeout)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    print(json.dumps({"turns": sum(m["role"] == "assistant" for m in messages)}))


if __name__ == "__main__":
    main()
