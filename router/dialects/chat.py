"""OpenAI Chat Completions (`POST /v1/chat/completions`): the chat format is the conversation itself."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from slimeish.common.finish import openai_finish_reason
from slimeish.router import openai_bodies as R
from slimeish.router.errors import APIError
from slimeish.router.jsontypes import JSONObject, TokenLogprob
from slimeish.router.pipeline import (
    Conversation,
    InFlight,
    PlannedTurn,
    StreamShape,
    assistant_message,
    engine_chunks,
    generate_replies,
    parse,
    plan_turn,
    record,
    serve_turn,
    stream_response,
)
from slimeish.router.schemas import ChatRequest, validate_messages
from slimeish.router.state import RouterState
from slimeish.router.streaming import ReplyStream, StreamedTurn, openai_closed, sse
from slimeish.router.turns import Generation


def _error_event(e: APIError) -> bytes:
    return sse(e.body())


async def chat_completions(request: Request, api_key: str | None = None) -> Response:
    return await serve_turn(request, api_key, _chat)


def conversation(req: ChatRequest, body: JSONObject) -> Conversation:
    # The raw messages: validated lazily by capture, only those a turn adds (`validate_messages`).
    return Conversation(
        body["messages"], body.get("tools") or None, req, req.new_tokens(), req.tool_choice, validate_messages
    )


async def _chat(state: RouterState, turn: InFlight, body: JSONObject, started: float) -> Response:
    session = turn.session
    req: ChatRequest = parse(ChatRequest, body)
    planned = await plan_turn(state, session, conversation(req, body))
    extra = {"top_logprobs_num": req.top_logprobs} if req.logprobs and req.top_logprobs else {}
    if req.stream:
        return await stream_chat(state, turn, planned, req, extra, started)
    gens, messages = await generate_replies(state, session, planned, extra)
    logprobs = [R.chat_logprobs(state.renderer, g) for g in gens] if req.logprobs else None
    out = R.chat_completion(req.model or state.model_name, messages, gens, len(planned.plan.input_ids), logprobs)
    await record(state, turn, planned.plan, gens, messages, started)
    return R.json_response(out)


async def stream_chat(
    state: RouterState, turn: InFlight, planned: PlannedTurn, req: ChatRequest, extra: JSONObject, started: float
) -> Response:
    chunks = await engine_chunks(state, turn.session, planned.plan, planned.params, extra)
    head = R.stream_head(req.model or state.model_name, "chatcmpl", "chat.completion.chunk")
    result = StreamedTurn()
    lp = (lambda entries: R.stream_logprobs(state.renderer, entries)) if req.logprobs else None
    stops, markers = planned.params.get("stop", []), state.renderer.reasoning_markers
    replies = ReplyStream(req.n, planned.parse_tools, stops, planned.forced, markers, state.renderer.call_marker)
    events = chat_events(
        chunks, head, replies, lambda g: assistant_message(state, g, planned.parse_tools, planned.forced), lp, result
    )
    usage = head if req.stream_options and req.stream_options.include_usage else None
    events = openai_closed(events, result, usage, len(planned.plan.input_ids))
    keepalive = sse({**head, "choices": [{"index": 0, "delta": {}}]})  # an empty delta: decoded, changes nothing
    shape = StreamShape(_error_event, lambda: keepalive)
    return stream_response(state, turn, planned.plan, events, result, started, shape)


async def chat_events(
    chunks: AsyncIterator[tuple[JSONObject, str]],
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
