"""Token streaming: engine SSE chunks in, the text deltas every dialect streams out.

The engine streams SGLang chunks, each cumulative: `text`, `output_ids` and log-probs hold everything
generated so far (SGLang's default, without `--incremental-streaming-output`). Text is
forwarded as it comes, except for a tail that might still change meaning: the start of a tool
call (`<tool_call>` becomes `tool_calls`, not content), the start of a stop string (trimmed from
the final text), trailing whitespace before a tool call, or an incomplete UTF-8 character. What
the client assembles is exactly the message recorded, so the next turn extends it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from slimeish.common.finish import openai_finish_reason
from slimeish.router.engine_api import EngineChunks, GenerateReply
from slimeish.router.jsontypes import JSONObject, TokenLogprob
from slimeish.router.openai_bodies import usage
from slimeish.router.renderers.base import CallMarker
from slimeish.router.tool_parser import TOOL_CALL_OPEN
from slimeish.router.turns import Generation, parse_generation

HERMES_CALL = CallMarker(TOOL_CALL_OPEN)  # where calls start for the families that wrap them in <tool_call>


def _held_suffix(text: str, markers: list[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of one of `markers`."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


@dataclass
class ContentStream:
    """The part of a choice's growing text that is safe to send now."""

    parse_tools: list[JSONObject] | bool | None  # a reply's tool calls are parsed (not content) when set
    stops: list[str]
    call: CallMarker = HERMES_CALL
    sent: str = ""
    blocked: bool = False  # a tool call started: the rest is not content unless parsing fails

    def delta(self, text: str) -> str:
        if self.blocked:
            return ""
        end = len(text)
        if self.parse_tools and (at := self._call_at(text)) >= 0:
            self.blocked, end = True, at
        for stop in self.stops:  # a stop string is trimmed from the final text: never send it
            if (at := text.find(stop, max(0, len(self.sent) - len(stop)), end)) >= 0:
                end = at
        markers = ([self.call.text] if self.parse_tools and not self.call.at_start else []) + self.stops
        end -= _held_suffix(text[:end], markers)
        safe = text[:end].rstrip() if self.parse_tools else text[:end]
        safe = safe.rstrip("\ufffd")
        if len(safe) <= len(self.sent):
            return ""
        out, self.sent = safe[len(self.sent) :], safe
        return out

    def _call_at(self, text: str) -> int:
        if self.call.at_start:  # the reply so far is blank (held: sent rstripped) or opens the call
            opened = text.lstrip()
            return len(text) - len(opened) if opened.startswith(self.call.text) else -1
        return text.find(self.call.text, len(self.sent))

    def finish(self, content: str) -> tuple[str, str]:
        """(last delta, the content the client ends up with) for the final message content."""
        if content.startswith(self.sent):
            return content[len(self.sent) :], content
        return "", self.sent


@dataclass
class ReasoningSplit:
    """A reply's leading `opening…closing` reasoning told apart from its content as the text grows.
    Held until the closing arrives: a reply whose reasoning never closes is all content, as the
    renderer parses it, so the stream never sends as reasoning what the answer calls content."""

    opening: str
    closing: str
    decided: bool = False
    reasoning: str | None = None
    content_at: int = 0

    def feed(self, text: str) -> tuple[str | None, str | None]:
        """(the reasoning, once, when it becomes known; the content so far, None while undecided)."""
        if self.decided:
            return None, self._content(text)
        if self.opening.startswith(text):  # nothing yet, or the opening still arriving
            return None, None
        if text.startswith(self.opening):
            at = text.find(self.closing, len(self.opening))
            if at < 0:
                return None, None
            self.reasoning, self.content_at = text[len(self.opening) : at].strip("\n"), at + len(self.closing)
        self.decided = True
        return self.reasoning, self._content(text)

    def _content(self, text: str) -> str:
        return text[self.content_at :].lstrip("\n") if self.reasoning is not None else text


@dataclass
class ChoiceAccumulator:
    """Follows one choice's cumulative stream chunks; the latest one is the whole response so far."""

    seen: int = 0  # log-prob entries already handed out
    last: GenerateReply = field(default_factory=lambda: GenerateReply())
    engine: str = ""

    def add(self, chunk: GenerateReply, engine: str) -> list[TokenLogprob]:
        """Take `chunk` as the response so far; returns the log-prob entries not seen before."""
        entries = chunk.get("meta_info", {}).get("output_token_logprobs") or []
        new, self.seen = entries[self.seen :], max(self.seen, len(entries))
        self.last, self.engine = chunk, engine
        return new

    def generation(self) -> Generation:
        return parse_generation(self.last, self.engine)


def sse(obj: JSONObject) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


@dataclass
class StreamedTurn:
    """The finished choices of a streamed turn, for recording."""

    generations: list[Generation] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)
    closing: list[bytes] = field(default_factory=list)  # last deltas and finish reasons, sent after recording
    on_recorded: list[Callable[[], None]] = field(default_factory=list)  # what a dialect keeps of a recorded turn
    body: JSONObject = field(default_factory=dict)  # the finished response object, for dialects that store it


@dataclass
class Delta:
    """Text of choice `index` that is safe to send now, and the log-prob entries new in its chunk."""

    index: int
    text: str
    entries: list[TokenLogprob]
    reasoning: str | None = None  # the reply's whole reasoning, in the chunk where it closed


@dataclass
class FinishedChoice:
    generation: Generation
    message: JSONObject  # the assistant message recorded, exactly what the client assembled
    last: str  # text still to send before the choice's closing events


class ReplyStream:
    """A turn's `n` choices followed through the engine's cumulative chunks: the deltas every
    dialect streams, then each choice's final message. `forced` is the reply's start that was
    appended to the prompt (tool_choice): it is streamed as if sampled. `reasoning` is the model
    family's (opening, closing) reasoning markup, None where it has none; `call` where its calls start."""

    def __init__(
        self,
        n: int,
        parse_tools: list[JSONObject] | bool | None,
        stops: list[str],
        forced: str = "",
        reasoning: tuple[str, str] | None = None,
        call: CallMarker = HERMES_CALL,
    ) -> None:
        self.accs = [ChoiceAccumulator() for _ in range(n)]
        self.texts = [ContentStream(parse_tools, stops, call) for _ in range(n)]
        self.splits = [ReasoningSplit(*reasoning) if reasoning else None for _ in range(n)]
        self.forced = forced

    async def deltas(self, chunks: EngineChunks) -> AsyncIterator[Delta]:
        reasoning: str | None
        content: str | None
        async for chunk, engine in chunks:
            i = chunk.get("index", 0)
            new = self.accs[i].add(chunk, engine)
            reasoning, content = None, self.forced + chunk.get("text", "")
            if (split := self.splits[i]) is not None:
                reasoning, content = split.feed(content)
            yield Delta(i, self.texts[i].delta(content) if content is not None else "", new, reasoning)

    def finish(self, to_message: Callable[[Generation], JSONObject]) -> list[FinishedChoice]:
        done = []
        for acc, text in zip(self.accs, self.texts, strict=True):
            gen = acc.generation()
            message = to_message(gen)
            last, content = text.finish(message.get("content") or "")
            message["content"] = content or None
            done.append(FinishedChoice(gen, message, last))
        return done


async def completion_events(
    chunks: EngineChunks, head: JSONObject, n: int, stops: list[str], result: StreamedTurn
) -> AsyncIterator[bytes]:
    """OpenAI `text_completion` stream events, as `chat_events`."""
    accs = [ChoiceAccumulator() for _ in range(n)]
    texts = [ContentStream(False, stops) for _ in range(n)]
    async for chunk, engine in chunks:
        i = chunk.get("index", 0)
        accs[i].add(chunk, engine)
        if delta := texts[i].delta(chunk.get("text", "")):
            yield sse({**head, "choices": [{"index": i, "text": delta, "logprobs": None, "finish_reason": None}]})
    for i in range(n):
        gen = accs[i].generation()
        last, text = texts[i].finish(gen.text)
        finish = openai_finish_reason(gen.finish_type)
        choice = {"index": i, "text": last, "logprobs": None, "finish_reason": finish}
        result.closing.append(sse({**head, "choices": [choice]}))
        result.generations.append(gen)
        result.answers.append(text)


async def openai_closed(
    events: AsyncIterator[bytes], result: StreamedTurn, usage_head: JSONObject | None, prompt_tokens: int
) -> AsyncIterator[bytes]:
    """OpenAI's streams end with the usage chunk (when asked for) and `[DONE]`, after recording."""
    async for event in events:
        yield event
    if usage_head is not None:
        result.closing.append(sse({**usage_head, "choices": [], "usage": usage(prompt_tokens, result.generations)}))
    result.closing.append(b"data: [DONE]\n\n")
