"""The renderer interface: what the router asks of a model family's chat format.

A renderer turns a conversation into the prompt's token ids, continues a segment after the
model's last reply from the exact tokens that were sampled (a "bridge"), parses a reply's
sampled tokens into content, reasoning and tool calls, and gives the opening that forces a
`tool_choice`. `ChatRenderer` (the model's own Jinja template with Hermes calls) is one
implementation; each family in this package is another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from slimeish.router.jsontypes import JSONObject

# Why a reply's tool-call markup did not parse (counted by family in metrics).
MALFORMED = "malformed"  # the call is complete but is not a valid call
TRUNCATED = "truncated"  # the length limit cut the call before it closed


@dataclass(frozen=True)
class CallMarker:
    """Where a reply's tool call starts in its text: from `text` on, the rest is a call (or a failed
    one), so a stream holds content back from it. `at_start`: only when the reply opens with it
    (Llama's bare JSON call), not anywhere in the reply."""

    text: str
    at_start: bool = False


class TemplateError(ValueError):
    """The chat format cannot render these messages (bad input, or not prefix-stable)."""


@dataclass
class ParsedReply:
    """A sampled reply as the agent gets it. On a parse failure the text goes back unchanged as
    content (never repaired or dropped) and `failure` says why."""

    content: str | None
    reasoning: str | None = None
    tool_calls: list[JSONObject] = field(default_factory=list)
    failure: str | None = None  # MALFORMED | TRUNCATED
    error: str | None = None  # what did not parse, for logs


class Renderer(Protocol):
    family: str  # the name `--renderer` takes; metrics label parse failures with it
    tokenizer: Any  # the model's Hugging Face tokenizer (its class depends on the checkpoint)
    eos_token: str
    eos_token_id: int
    reasoning_markers: tuple[str, str] | None  # (opening, closing) of a reply's reasoning; None: no reasoning
    next_turn_prompt: str  # the family's `--next-turn-prompt auto`: "sampled" or "template"
    call_marker: CallMarker  # where a call starts in a reply's text

    @property
    def context_length(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def token_text(self, token_id: int) -> str: ...

    def full_ids(self, messages: list[JSONObject], tools: list[JSONObject] | None) -> list[int]:
        """The whole conversation up to the next generation prompt."""
        ...

    def template_ids(self, messages: list[JSONObject], tools: list[JSONObject] | None) -> list[int]:
        """`full_ids` as the model's chat template alone renders it (`--next-turn-prompt template`):
        what a server without the router gives the engine, e.g. without old reasoning."""
        ...

    def continuation(
        self,
        tokens: list[int],
        output_len: int,
        anchor: JSONObject,
        tail: list[JSONObject],
        tools: list[JSONObject] | None,
    ) -> list[int]:
        """Ids that follow `tokens` (a segment whose last `output_len` ids are the sampled reply
        `anchor`) up to the next generation prompt, with `tail` (the new messages) rendered.
        Raises TemplateError when the segment cannot be continued exactly."""
        ...

    def parse(
        self, forced: str, output_ids: list[int], text: str, finish_type: str, tools: list[JSONObject] | None
    ) -> ParsedReply:
        """A reply: `forced` (the opening tool_choice put in the prompt) and the sampled ids, whose
        text the engine gave as `text`; tool calls are parsed only when `tools` (the request's
        chat-format tools, whose schemas type the arguments of formats that write them as text) are set."""
        ...

    def tool_call_opening(self, name: str | None) -> tuple[list[int], str]:
        """(ids, text) that start a reply calling `name` (any function for None)."""
        ...


def reply_message(parsed: ParsedReply) -> dict[str, Any]:
    """The chat-format assistant message for a parsed reply."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        message["tool_calls"] = parsed.tool_calls
    return message
