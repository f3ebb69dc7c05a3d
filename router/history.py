"""Compare an agent's message history with what the router saw, and name why they differ.

Agents resend their history each turn, in their own formatting (`content: null` vs `""`, text
parts vs a string, re-serialised tool-call arguments). `canonical` removes those differences so
that only real edits count; `split_reason` names the edit when a turn does not extend a segment.
"""

from __future__ import annotations

import json
import re
from typing import Any

_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)

# Why a turn started a new segment (recorded on the segment and counted in metrics).
TOOLS_CHANGED = "tools_changed"  # the tool list changed, so the system prompt changed
NEW_CONVERSATION = "new_conversation"  # a different system/first message: a new task
# A new conversation that opens with the model's last reply of a conversation, quoted (compacted
# context: Claude Code's auto-compact, Codex's compaction hand the summary on as a user message)
COMPACTION = "compaction"
# A new conversation that opens with a string argument of a tool call the session's conversations
# hold (Claude Code's `Agent` tool: the sub-agent's first message is the call's `prompt`)
SUB_AGENT = "sub_agent"
PROMPT_REPEATED = "prompt_repeated"  # the same (or a shorter) history again: a retry or regeneration
HISTORY_TRUNCATED = "history_truncated"  # earlier messages were dropped
HISTORY_EDITED = "history_edited"  # earlier messages were rewritten (summaries, edits)
ASSISTANT_EDITED = "assistant_edited"  # the model's last reply came back changed
REPLY_DROPPED = "reply_dropped"  # the model's last reply left out, the history before it kept
REASONING_DROPPED = "reasoning_dropped"  # the model's last reply came back without its <think> part
TOKENS_DIVERGED = "tokens_diverged"  # token-in / completions: the prompt does not extend the last one
PARALLEL_CHOICE = "parallel_choice"  # choice i > 0 of an n > 1 request
RESUMED_SEGMENT = "resumed_segment"  # the turn extends a segment other than the latest one
CONCURRENT_TURN = "concurrent_turn"  # two turns raced to extend one segment; the later one forks
TEMPLATE_UNSTABLE = "template_unstable"  # the template cannot render the tail alone
# --next-turn-prompt template: the template's rendering of the history (e.g. without old
# reasoning) does not extend the tokens the segment holds, sampled ones included.
TEMPLATE_RENDERED = "template_rendered"

# Set by a dialect on an assistant message whose reasoning came back under a signature the router
# did not give (`slimeish.router.reasoning`): the message is then never the reply it returned.
FOREIGN_REASONING = "slimeish_foreign_reasoning"


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content or ""


def _args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


# (role, text without trailing whitespace, each call's (name, arguments as sorted JSON), tool_call_id)
Canonical = tuple[Any, str, tuple[tuple[str, str], ...], Any]


def canonical(message: dict[str, Any]) -> Canonical:
    """A hashable form of a message that ignores formatting but not meaning: trailing whitespace
    (smolagents strips the newline each reply ends with), tool-call ids and the arguments' JSON
    spacing and key order. A reply echoed with only those changed extends its segment, which
    continues from the sampled tokens, never from the echo."""
    calls = tuple(
        (c["function"]["name"], json.dumps(_args(c["function"].get("arguments")), sort_keys=True))
        for c in message.get("tool_calls") or ()
    )
    return (message.get("role"), _text(message.get("content")).rstrip(), calls, message.get("tool_call_id"))


def reasoning_kept(echo: dict[str, Any], reply: dict[str, Any]) -> bool:
    """Whether the echoed reply's reasoning is what was sampled, or absent (most agents drop it:
    the segment continues from the sampled tokens either way). Reasoning that differs, or that a
    dialect found under a signature the router did not give (`FOREIGN_REASONING`), is an edit."""
    if echo.get(FOREIGN_REASONING):
        return False
    sent = echo.get("reasoning_content")
    return not sent or sent.strip() == (reply.get("reasoning_content") or "").strip()


def _first_mismatch(a: list[Canonical], b: list[Canonical]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _first_content_index(history: list[Canonical]) -> int:
    return 1 if history and history[0][0] in ("system", "developer") else 0


def split_reason(previous: list[Canonical], reply: Canonical, new: list[Canonical]) -> str | None:
    """None when `new` extends `previous + [reply]`, else why it does not (all canonical)."""
    seen = [*previous, reply]
    i = _first_mismatch(seen, new)
    if i == len(seen):
        return None if len(new) > len(seen) else PROMPT_REPEATED
    if i == len(new):
        return PROMPT_REPEATED if len(new) == len(previous) else HISTORY_TRUNCATED
    if i == len(previous) and new[i][0] == "assistant":
        stripped = (reply[0], _THINK.sub("", reply[1]), reply[2], reply[3])
        return REASONING_DROPPED if stripped == new[i] and stripped != reply else ASSISTANT_EDITED
    rest = new[i:]
    if reply in rest:  # the conversation goes on after the last reply, with earlier messages changed
        kept = all(m in seen[i:] for m in rest[: rest.index(reply)])
        return HISTORY_TRUNCATED if kept else HISTORY_EDITED
    if i <= _first_content_index(seen):  # a sub-agent or a new task: it differs from the start
        return NEW_CONVERSATION
    # the history kept up to the reply, which is left out: e.g. mini-swe-agent answers a reply it
    # cannot parse with only its error
    return REPLY_DROPPED if i == len(previous) else HISTORY_EDITED


# A line or argument shorter than this is too common to say where a conversation came from
_QUOTED = 16


def _opening(new: list[Canonical]) -> str:
    """The text of the messages before the first assistant one, system messages left out."""
    opening = []
    for role, text, _calls, _id in new:
        if role == "assistant":
            break
        if role not in ("system", "developer"):
            opening.append(text)
    return "\n".join(opening)


def _string_arguments(message: Canonical) -> list[str]:
    values: list[str] = []
    for _name, arguments in message[2]:
        parsed = _args(arguments)
        if isinstance(parsed, dict):
            values += [v.strip() for v in parsed.values() if isinstance(v, str)]
    return values


def handed_on(new: list[Canonical], conversations: list[list[Canonical]]) -> str | None:
    """`COMPACTION` or `SUB_AGENT` when a new conversation opens with what one of the session's
    `conversations` (each its history and the reply last returned) handed on: a line of its last
    reply (a summary), or a string argument of one of its tool calls (a sub-agent's task). Only
    text its messages before that reply do not hold counts, so a new task that repeats its
    predecessor's instructions is neither."""
    opening = _opening(new)
    for conversation in conversations:
        held = "\n".join(m[1] for m in conversation[:-1])
        if any(_quoted(line.strip(), opening, held) for line in conversation[-1][1].splitlines()):
            return COMPACTION
        calls = [a for m in conversation if m[0] == "assistant" for a in _string_arguments(m)]
        if any(_quoted(a, opening, held) for a in calls):
            return SUB_AGENT
    return None


def _quoted(text: str, opening: str, held: str) -> bool:
    return len(text) >= _QUOTED and text in opening and text not in held
