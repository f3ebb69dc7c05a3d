"""Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`): Claude Code and the `anthropic` SDK.

The request becomes the chat conversation capture takes: `system` a system message, `tool_use`
blocks an assistant's `tool_calls`, each `tool_result` a tool message (before the user's text of
the same message, as Anthropic orders them). The reply's reasoning (renderers that parse it:
`reasoning_content`), text and parsed calls become `thinking`, `text` and `tool_use` blocks; the
thinking block's `signature` is the router's reference to it (`slimeish.router.reasoning`). A
`thinking` block sent back is its message's reasoning (checked by capture: the sampled one, or
none, continues the segment); one whose signature is not the router's, and any
`redacted_thinking` block (the router writes none), mark the message as edited.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, Literal

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from slimeish.router import history as H
from slimeish.router import openai_bodies as R
from slimeish.router.dialects.base import endpoint
from slimeish.router.dialects.incremental import convert
from slimeish.router.dialects.tools import chat_tools, joined_text, served_tools, tool_choice
from slimeish.router.engine_api import EngineChunks
from slimeish.router.errors import APIError, from_validation_error
from slimeish.router.jsontypes import JSONObject
from slimeish.router.pipeline import (
    Conversation,
    InFlight,
    PlannedTurn,
    assistant_message,
    parse,
    serve_turn,
)
from slimeish.router.renderers.base import TemplateError
from slimeish.router.schemas import SamplingFields, ToolChoice, TopK
from slimeish.router.sessions import Session
from slimeish.router.state import RouterState
from slimeish.router.streaming import ReplyStream, StreamedTurn
from slimeish.router.turns import Generation


class _Block(BaseModel):
    model_config = ConfigDict(extra="allow")  # e.g. `cache_control`, `citations`: accepted, ignored


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str


# A tool_result with `is_error`: chat formats have no field for it, so the model reads it in the text.
ERROR_PREFIX = "Error: "

AnyBlock = TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
Block = Annotated[AnyBlock, Field(discriminator="type")]


class MessageParam(BaseModel):
    role: Literal["user", "assistant", "system"]  # system: a Claude Code beta, rendered where it stands
    content: str | list[Block]


class ToolParam(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["custom"] | None = None  # Anthropic's server tools (web_search, bash, ...) are refused
    name: str
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoiceParam(BaseModel):
    model_config = ConfigDict(extra="allow")  # disable_parallel_tool_use: accepted, ignored
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # metadata, service_tier, thinking: accepted, ignored
    model: str | None = None
    messages: list[Any] = Field(min_length=1)  # checked one by one (`_converted`): only those a turn adds
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)  # required, as Anthropic requires it
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: TopK | None = None
    stream: bool = False


async def count_tokens(request: Request, api_key: str | None = None) -> Response:
    return await serve_turn(request, api_key, _count_tokens)


async def _count_tokens(state: RouterState, turn: InFlight, body: JSONObject, started: float) -> Response:
    req: CountTokensRequest = parse(CountTokensRequest, _served(body))
    msgs, tools = chat_messages(req, lambda ref, text: True), _chat_tools(req)  # signatures change no count
    try:
        ids = state.renderer.full_ids(msgs, tools)
    except TemplateError as e:
        raise APIError(400, str(e), param="messages") from None
    return R.json_response({"input_tokens": len(ids)})


def _served(body: JSONObject) -> JSONObject:
    return served_tools(body, (None, "custom"), "a custom tool")


def conversation(state: RouterState, req: MessagesRequest, session: Session | None) -> Conversation:
    sampling = SamplingFields(
        n=1,
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        stop=req.stop_sequences,
    )
    session_id = session.identity.session_id if session else ""
    converter = partial(_converted, lambda ref, text: state.signer.verify(session_id, ref, text))
    messages = [*_system(req), *convert(session, "messages", req.messages, converter)]
    return Conversation(messages, _chat_tools(req), sampling, req.max_tokens, _tool_choice(req))


Verifier = Callable[[str, str], bool]  # (signature, thinking): the router's own reasoning?


def chat_messages(req: CountTokensRequest, verified: Verifier) -> list[JSONObject]:
    """The whole request as chat messages."""
    return [*_system(req), *_converted(verified, req.messages, 0, frozenset())[0]]


def _system(req: CountTokensRequest) -> list[JSONObject]:
    return [{"role": "system", "content": joined_text(req.system)}] if req.system else []


_MESSAGE: TypeAdapter[MessageParam] = TypeAdapter(MessageParam)


def _converted(
    verified: Verifier, raw: list[Any], start: int, calls: frozenset[str]
) -> tuple[list[JSONObject], frozenset[str]]:
    """Messages `start`.. validated and converted; `calls` are the tool_use ids of the assistant
    message before them, which a tool_result may answer."""
    out: list[JSONObject] = []
    for i in range(start, len(raw)):
        try:
            m = _MESSAGE.validate_python(raw[i])
        except ValidationError as e:
            raise from_validation_error(e, f"messages.{i}") from None
        blocks: list[AnyBlock] = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        if m.role == "system":
            out.append({"role": "system", "content": _system_text(blocks, i)})
        elif m.role == "assistant":
            out.append(_assistant(blocks, i, verified))
            calls = frozenset(b.id for b in blocks if isinstance(b, ToolUseBlock))
        else:
            out += _user(blocks, i, calls)
            calls = frozenset()
    return out, calls


def _system_text(blocks: list[AnyBlock], i: int) -> str:
    for j, b in enumerate(blocks):
        if not isinstance(b, TextBlock):
            raise APIError(400, f"messages.{i}.content.{j}: a system message holds text blocks only, not {b.type}")
    return joined_text([b for b in blocks if isinstance(b, TextBlock)])


def _assistant(blocks: list[AnyBlock], i: int, verified: Verifier) -> JSONObject:
    text, reasoning, foreign, tool_calls = "", "", False, []
    for j, b in enumerate(blocks):
        if isinstance(b, ThinkingBlock):
            reasoning += b.thinking
            foreign = foreign or not verified(b.signature, b.thinking)
        elif isinstance(b, RedactedThinkingBlock):
            foreign = True
        elif isinstance(b, TextBlock):
            text += b.text
        elif isinstance(b, ToolUseBlock):
            arguments = json.dumps(b.input, ensure_ascii=False)
            tool_calls.append({"id": b.id, "type": "function", "function": {"name": b.name, "arguments": arguments}})
        elif isinstance(b, ToolResultBlock):
            raise APIError(400, f"messages.{i}.content.{j}: tool_result blocks belong in a user message")
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if foreign:
        message[H.FOREIGN_REASONING] = True
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def _user(blocks: list[AnyBlock], i: int, calls: frozenset[str]) -> list[JSONObject]:
    results, text = [], ""
    for j, b in enumerate(blocks):
        if isinstance(b, ToolResultBlock):
            if b.tool_use_id not in calls:
                raise APIError(
                    400,
                    f"messages.{i}.content.{j}: tool_result for tool_use_id {b.tool_use_id!r} has no tool_use "
                    "block with that id in the previous assistant message",
                )
            content = ERROR_PREFIX + joined_text(b.content) if b.is_error else joined_text(b.content)
            results.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": content})
        elif isinstance(b, TextBlock):
            text += b.text
        else:
            raise APIError(400, f"messages.{i}.content.{j}: {b.type} blocks belong in an assistant message")
    return results + ([{"role": "user", "content": text}] if text or not results else [])


def _chat_tools(req: CountTokensRequest) -> list[JSONObject] | None:
    return chat_tools((t.name, t.description, t.input_schema) for t in req.tools or [])


def _tool_choice(req: CountTokensRequest) -> ToolChoice:
    """Anthropic's `any` is "required"; `tool` names one."""
    choice, names = req.tool_choice, [t.name for t in req.tools or []]
    if choice is None:
        return None
    if choice.type == "tool":
        return tool_choice(None, choice.name or "", names)
    return tool_choice("required" if choice.type == "any" else choice.type, None, names, said=choice.type)


Signer = Callable[[str], str]  # a thinking block's signature: the router's reference to it


def content_blocks(reply: JSONObject, sign: Signer) -> list[JSONObject]:
    reasoning = reply.get("reasoning_content")
    blocks = [_thinking_block(reasoning, sign)] if reasoning else []
    blocks += [{"type": "text", "text": reply["content"]}] if reply.get("content") else []
    for call in reply.get("tool_calls") or []:
        f = call["function"]
        blocks.append({"type": "tool_use", "id": call["id"], "name": f["name"], "input": json.loads(f["arguments"])})
    return blocks


def stop_reason(gen: Generation, reply: JSONObject, stops: list[str]) -> tuple[str, str | None]:
    """Anthropic's (`stop_reason`, `stop_sequence`) of a finished reply."""
    if reply.get("tool_calls"):
        return "tool_use", None
    if gen.finish_type == "length":
        return "max_tokens", None
    matched = gen.matched_stop
    return ("stop_sequence", matched) if matched is not None and matched in stops else ("end_turn", None)


def _thinking_block(text: str, sign: Signer) -> JSONObject:
    return {"type": "thinking", "thinking": text, "signature": sign(text)}


def message_body(head: JSONObject, gen: Generation, reply: JSONObject, stops: list[str], sign: Signer) -> JSONObject:
    reason, sequence = stop_reason(gen, reply, stops)
    return {
        **head,
        "content": content_blocks(reply, sign),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {**head["usage"], "output_tokens": len(gen.output_ids)},
    }


def _head(message_id: str, model: str, prompt_tokens: int) -> JSONObject:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
    }


def event(kind: str, data: JSONObject) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


_PING = event("ping", {})


@dataclass
class MessagesTurn:
    req: MessagesRequest
    conversation: Conversation
    message_id: str
    sign: Signer  # the thinking block's signature, a reference to this message

    @property
    def stream(self) -> bool:
        return self.req.stream

    @property
    def engine_extra(self) -> JSONObject:
        return {}

    def answer(
        self, state: RouterState, planned: PlannedTurn, gens: list[Generation], replies: list[JSONObject]
    ) -> JSONObject:
        return message_body(self._head(state, planned), gens[0], replies[0], planned.params.get("stop", []), self.sign)

    def events(
        self, state: RouterState, planned: PlannedTurn, chunks: EngineChunks, result: StreamedTurn
    ) -> AsyncIterator[bytes]:
        return message_events(state, chunks, planned, self._head(state, planned), self.sign, result)

    def keepalive(self) -> bytes:
        return _PING

    def _head(self, state: RouterState, planned: PlannedTurn) -> JSONObject:
        return _head(self.message_id, self.req.model or state.model_name, len(planned.plan.input_ids))

    def error_event(self, error: APIError) -> bytes:
        return b"event: error\ndata: " + orjson.dumps(error.anthropic_body()) + b"\n\n"

    def recorded(self, body: JSONObject, answers: list[JSONObject]) -> None:
        """Nothing: a Messages client sends its whole history each turn."""


class Messages:
    def turn(self, state: RouterState, session: Session | None, body: JSONObject) -> MessagesTurn:
        req = parse(MessagesRequest, _served(body))
        message_id = R.new_id("msg_")
        session_id = session.identity.session_id if session else ""
        sign: Signer = lambda text: state.signer.sign(session_id, message_id, text)  # noqa: E731
        return MessagesTurn(req, conversation(state, req, session), message_id, sign)


messages = endpoint(Messages())


async def message_events(
    state: RouterState,
    chunks: EngineChunks,
    planned: PlannedTurn,
    head: JSONObject,
    sign: Signer,
    result: StreamedTurn,
) -> AsyncIterator[bytes]:
    """Anthropic's stream: the thinking block (once its end is sampled) and text deltas while the
    engine streams; the tool_use blocks, stop reason and `message_stop` go to `result.closing`,
    sent once the turn is recorded."""
    stops = planned.params.get("stop", [])
    yield event("message_start", {"message": head})
    markers, call = state.renderer.reasoning_markers, state.renderer.call_marker
    replies = ReplyStream(1, planned.parse_tools, stops, planned.forced, markers, call)
    blocks, text_at = 0, -1  # blocks opened so far; the text block's index once open
    async for d in replies.deltas(chunks):
        if d.reasoning:
            for e in _thinking_events(blocks, _thinking_block(d.reasoning, sign)):
                yield e
            blocks += 1
        if d.text:
            if text_at < 0:
                text_at, blocks = blocks, blocks + 1
                yield _text_start(text_at)
            yield _text_delta(text_at, d.text)
    (done,) = replies.finish(lambda g: assistant_message(state, g, planned.parse_tools, planned.forced))
    closing = []
    if done.last and text_at < 0:
        text_at, blocks = blocks, blocks + 1
        closing.append(_text_start(text_at))
    if done.last:
        closing.append(_text_delta(text_at, done.last))
    if text_at >= 0:
        closing.append(event("content_block_stop", {"index": text_at}))
    calls = [b for b in content_blocks(done.message, sign) if b["type"] == "tool_use"]
    for index, block in enumerate(calls, start=blocks):
        closing += _tool_use_events(index, block)
    reason, sequence = stop_reason(done.generation, done.message, stops)
    delta = {"stop_reason": reason, "stop_sequence": sequence}
    usage = {"output_tokens": len(done.generation.output_ids)}
    closing.append(event("message_delta", {"delta": delta, "usage": usage}))
    closing.append(event("message_stop", {}))
    result.closing += closing
    result.generations.append(done.generation)
    result.answers.append(done.message)


def _thinking_events(index: int, block: JSONObject) -> list[bytes]:
    """A thinking block whole: its text is known only once it closed; the signature comes last, as
    Anthropic sends it."""
    return [
        event(
            "content_block_start",
            {"index": index, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
        ),
        event(
            "content_block_delta", {"index": index, "delta": {"type": "thinking_delta", "thinking": block["thinking"]}}
        ),
        event(
            "content_block_delta",
            {"index": index, "delta": {"type": "signature_delta", "signature": block["signature"]}},
        ),
        event("content_block_stop", {"index": index}),
    ]


def _text_start(index: int) -> bytes:
    return event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})


def _text_delta(index: int, text: str) -> bytes:
    return event("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": text}})


def _tool_use_events(index: int, block: JSONObject) -> list[bytes]:
    start = {**block, "input": {}}
    partial = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
    return [
        event("content_block_start", {"index": index, "content_block": start}),
        event("content_block_delta", {"index": index, "delta": partial}),
        event("content_block_stop", {"index": index}),
    ]
