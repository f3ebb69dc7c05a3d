"""Tool calls between an opening and a closing token, found on a reply's sampled ids.

Families whose calls are wrapped in dedicated tokens (`<tool_call>…</tool_call>` in Qwen3,
Qwen3-Coder and GLM-4.5) share this split: each call's body is the text between its tokens,
read by the family's own `parse_one`; the text before, between and after calls is content. A
closing token that leaves the body unreadable may sit inside an argument (a JSON string holding
`</tool_call>`), so the next closing token is tried before the call is called malformed.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from slimeish.router.jsontypes import JSONObject
from slimeish.router.renderers.base import MALFORMED, TRUNCATED, ParsedReply

CallParser = Callable[[str], JSONObject]  # a call's body text -> a chat-format tool call (ValueError if it is none)


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


def tool_call(name: str, arguments: str) -> JSONObject:
    """A chat-format tool call; `arguments` is the JSON object as text."""
    return {"id": call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def tagged_calls(
    body: list[int],
    tags: tuple[int, int],
    text: Callable[[list[int]], str],
    parse_one: CallParser,
    finish_type: str,
    reasoning: str | None,
) -> ParsedReply:
    """The calls in `body` (the reply after its reasoning) between the `tags` (opening, closing)
    tokens. A call that reads nowhere fails the reply: its whole text goes back as content,
    `truncated` when the length limit cut it before any closing token, else `malformed`."""
    opening, closing = tags
    texts, calls, at = [], [], 0
    while (start := _index(body, opening, at)) >= 0:
        texts.append(text(body[at:start]))
        end, error = _index(body, closing, start + 1), "unterminated tool call"
        while end >= 0:
            try:
                calls.append(parse_one(text(body[start + 1 : end]).strip()))
                break
            except ValueError as e:  # json.JSONDecodeError is a ValueError
                error, end = str(e), _index(body, closing, end + 1)
        if end < 0:
            cut = finish_type == "length" and _index(body, closing, start + 1) < 0
            return ParsedReply(text(body).lstrip("\n"), reasoning, failure=TRUNCATED if cut else MALFORMED, error=error)
        at = end + 1
    texts.append(text(body[at:]))
    content = "\n".join(t.strip() for t in texts if t.strip())
    return ParsedReply(content or None, reasoning, calls)


def _index(ids: list[int], token: int, start: int) -> int:
    try:
        return ids.index(token, start)
    except ValueError:
        return -1
