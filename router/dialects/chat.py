"""OpenAI Chat Completions (`POST /v1/chat/completions`): the chat format is the conversation itself."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from slimeish.common.finish import openai_finish_reason
from slimeish.router import openai_bodies as R
from slimeish.router.dialects.base import endpoint
from slimeish.router.engine_api import EngineChunks
from slimeish.router.errors import APIError
from slimeish.router.jsontypes import JSONObject, TokenLogprob
from slimeish.router.pipeline import Conversation, PlannedTurn, assistant_message, parse
from slimeish.router.schemas import ChatRequest, validate_messages
from slimeish.router.sessions import Session
from slimeish.router.state import RouterState
from slimeish.router.streaming import ReplyStream, StreamedTurn, openai_closed, sse
from slimeish.router.turns import Generation


@dataclass
class ChatTurn:
    """A chat request: the chat format is the conversation itself."""

    req: ChatRequest
    conversation: Conversation
    head: JSONObject  # what every stream chunk repeats: id, object, created, model

    @property
    def stream(self) -> bool:
        return self.req.stream

    @property
    def engine_extra(self) -> JSONObject:
        req = self.req
        return {"top_logprobs_num": req.top_logprobs} if req.logprobs and req.top_logprobs else {}

    def answer(
        self, state: RouterState, planned: PlannedTurn, gens: list[Generation], replies: list[JSONObject]
    ) -> JSONObject:
        logprobs = [R.chat_logprobs(state.renderer, g) for g in gens] if self.req.logprobs else None
        model = self.req.model or state.model_name
        return R.chat_completion(model, replies, gens, len(planned.plan.input_ids), logprobs)

    def events(
        self, state: RouterState, planned: PlannedTurn, chunks: EngineChunks, result: StreamedTurn
    ) -> AsyncIterator[bytes]:
        req, renderer = self.req, state.renderer
        lp = (lambda entries: R.stream_logprobs(renderer, entries)) if req.logprobs else None
        stops, markers = planned.params.get("stop", []), renderer.reasoning_markers
        replies = ReplyStream(req.n, planned.parse_tools, stops, planned.forced, markers, renderer.call_marker)

        def to_message(gen: Generation) -> JSONObject:
            return assistant_message(state, gen, planned.parse_tools, planned.forced)

        events = chat_events(chunks, self.head, replies, to_message, lp, result)
        usage = self.head if req.stream_options and req.stream_options.include_usage else None
        return openai_closed(events, result, usage, len(planned.plan.input_ids))

    def keepalive(self) -> bytes:
        return sse({**self.head, "choices": [{"index": 0, "delta": {}}]})  # an empty delta: decoded, changes nothing

    def error_event(self, error: APIError) -> bytes:
        return sse(error.body())

    def recorded(self, body: JSONObject, answers: list[JSONObject]) -> None:
        """Nothing: a chat client sends its whole history each turn."""


class Chat:
    def turn(self, state: RouterState, session: Session | None, body: JSONObject) -> ChatTurn:
        req = parse(ChatRequest, body)
        # The raw messages: validated lazily by capture, only those a turn adds (`validate_messages`).
        conv = Conversation(
            body["messages"], body.get("tools") or None, req, req.new_tokens(), req.tool_choice, validate_messages
        )
        head = R.stream_head(req.model or state.model_name, "chatcmpl", "chat.completion.chunk")
        return ChatTurn(req, conv, head)


chat_completions = endpoint(Chat())


async def chat_events(
    chunks: EngineChunks,
    head: JSONObject,
    replies: ReplyStream,
    to_message: Callable[[Generation], JSONObject],
    token_logprobs: Callable[[list[TokenLogprob]], JSONObject] | None,
    result: StreamedTurn,
) -> AsyncIterator[bytes]:
    """OpenAI `chat.completion.chunk` events while the engine streams; at the end, fills `result`
    (the closing events go there too, to be sent once the turn is recorded)."""
    for i in range(len(replies.accs)):
        yield sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}}]})
    async for d in replies.deltas(chunks):
        if d.reasoning:
            yield sse({**head, "choices": [{"index": d.index, "delta": {"reasoning_content": d.reasoning}}]})
        if d.text or (d.entries and token_logprobs):
            lp = token_logprobs(d.entries) if token_logprobs else None
            yield sse({**head, "choices": [{"index": d.index, "delta": {"content": d.text}, "logprobs": lp}]})
    for i, done in enumerate(replies.finish(to_message)):
        message = done.message
        deltas: list[dict[str, Any]] = [{"content": done.last}] if done.last else []
        deltas += [{"tool_calls": [{"index": j, **c}]} for j, c in enumerate(message.get("tool_calls") or [])]
        result.closing += [sse({**head, "choices": [{"index": i, "delta": d}]}) for d in deltas]
        finish = openai_finish_reason(done.generation.finish_type, tool_calls=bool(message.get("tool_calls")))
        result.closing.append(sse({**head, "choices": [{"index": i, "delta": {}, "finish_reason": finish}]}))
        result.generations.append(done.generation)
        result.answers.append(message)
