"""Parse Hermes/Qwen-style tool calls (`<tool_call>{json}</tool_call>`) out of model output.

A malformed call is never dropped or repaired: the whole text goes back to the agent as plain
content and the caller counts the failure, so the agent sees exactly what the model wrote.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from slimeish.router.jsontypes import JSONObject

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ParsedOutput:
    content: str | None
    tool_calls: list[JSONObject] = field(default_factory=list)
    parse_error: str | None = None  # set when the text held tool-call markup that did not parse


def _call_id() -> str:
    return "call_" + secrets.token_hex(12)


def parse_call(body: str) -> JSONObject:
    """One call's JSON body as a chat-format tool call (ValueError when it is not one)."""
    call = json.loads(body)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ValueError("a tool call must be a JSON object with a string 'name'")
    args = call.get("arguments", {})
    if isinstance(args, str):
        args = json.loads(args)
    if not isinstance(args, dict):
        raise ValueError("tool-call 'arguments' must be a JSON object")
    return {
        "id": _call_id(),
        "type": "function",
        "function": {"name": call["name"], "arguments": json.dumps(args, ensure_ascii=False)},
    }


def parse_tool_calls(text: str) -> ParsedOutput:
    """Split `text` into content before the first call and the list of calls. A `</tool_call>`
    that leaves a call's JSON unreadable may sit inside a string argument: the next one is tried."""
    if TOOL_CALL_OPEN not in text:
        return ParsedOutput(content=text)
    calls, at = [], 0
    while (start := text.find(TOOL_CALL_OPEN, at)) >= 0:
        body_at, end, error = start + len(TOOL_CALL_OPEN), text.find(TOOL_CALL_CLOSE, start), "unterminated <tool_call>"
        while end >= 0:
            try:
                calls.append(parse_call(text[body_at:end].strip()))
                break
            except ValueError as e:  # json.JSONDecodeError is a ValueError
                error, end = str(e), text.find(TOOL_CALL_CLOSE, end + 1)
        if end < 0:
            return ParsedOutput(content=text, parse_error=error)
        at = end + len(TOOL_CALL_CLOSE)
    content = text[: text.index(TOOL_CALL_OPEN)].strip()
    return ParsedOutput(content=content or None, tool_calls=calls)
