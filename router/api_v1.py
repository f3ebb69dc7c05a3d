"""The agent-facing endpoints: OpenAI `/v1` (per session or anonymous) and token-in `/generate`.

Every generation follows the same steps: resolve the session from its key, validate, plan the
turn's tokens (capture), check the context window, generate on an engine, answer the agent,
then commit the turn and write it through to the store. The turn endpoints are dispatched by
`slimeish.router.dispatch`, ahead of FastAPI; `/v1/models` is an ordinary route.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from slimeish.router import responses as R
from slimeish.router.capture import Capture, TurnPlan
from slimeish.router.engine_pool import EngineFailedMidStream
from slimeish.router.errors import APIError, from_validation_error, known_error
from slimeish.router.render import ChatRenderer, TemplateError
from slimeish.router.schemas import ChatRequest, CompletionRequest, NamedToolChoice, SamplingFields, validate_messages
from slimeish.router.sessions import Session
from slimeish.router.state import RouterState, get_state
from slimeish.router.streaming import StreamedTurn, chat_events, completion_events, sse
from slimeish.router.tool_parser import parse_tool_calls
from slimeish.router.turns import Generation

api = APIRouter()
KEY_PREFIX = "sk-slimeish-"


async def read_json(request: Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as e:
        raise APIError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    return body


def parse(model: type[BaseModel], body: dict) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise from_validation_error(e) from None


def bearer_token(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else ""


def resolve_session(state: RouterState, request: Request, path_key: str | None) -> Session | None:
    """The session owning the key (URL path or bearer), None for an allowed anonymous call."""
    if path_key is not None:
        return session_for_key(state, path_key)
    key = bearer_token(request)
    if state.config.allow_anonymous and not key.startswith(KEY_PREFIX) and not state.sessions.knows(key):
        return None
    return session_for_key(state, key)


def session_for_key(state: RouterState, key: str | None) -> Session:
    """The open session owning `key`: 401 when none does, 409 when it is finished."""
    session = state.sessions.by_api_key(key) if key else None
    if session is None and key and (closed := state.sessions.closed_by_key.get(key)):
        raise APIError(409, f"session {closed.session_id} is finished", code="session_finished")
    if session is None:
        raise APIError(401, "unknown or missing session key", type="authentication_error", code="invalid_api_key")
    if session.closed:
        raise APIError(409, f"session {session.session_id} is finished", code="session_finished")
    return session


@dataclass
class InFlight:
    """A turn counted as in flight on its session until recorded or failed (a finish waits for
    it). A streamed turn is handed to its response body, which ends it when the stream ends."""

    session: Session | None
    handed_off: bool = False
    ended: bool = False

    def end(self) -> None:
        if self.session is not None and not self.ended:
            self.ended = True
            self.session.end_turn()


@contextlib.contextmanager
def in_flight(session: Session | None) -> Iterator[InFlight]:
    if session is not None:
        session.begin_turn()
    turn = InFlight(session)
    try:
        yield turn
    finally:
        if not turn.handed_off:
            turn.end()


def sampling_params(
    state: RouterState, session: Session | None, req: SamplingFields, max_tokens: int | None, prompt_len: int
) -> dict:
    """SGLang sampling params: the request's, else the session's defaults (else the engine's); the
    context check of an explicit `max_tokens` gives OpenAI's `context_length_exceeded`, a default
    budget is capped by the room left."""
    defaults = dict(session.sampling_defaults) if session else {}
    budget = defaults.pop("max_new_tokens", None) or state.config.default_max_tokens
    room = state.context_length - prompt_len
    if room <= 0 or (max_tokens is not None and max_tokens > room):
        raise APIError(
            400,
            f"this model's maximum context length is {state.context_length} tokens; the prompt has "
            f"{prompt_len} and {max_tokens or 1} more were requested",
            param="messages",
            code="context_length_exceeded",
        )
    params: dict[str, Any] = {"max_new_tokens": max_tokens or min(room, budget), "n": req.n} | defaults
    params |= req.model_dump(include={"temperature", "top_p", "top_k"}, exclude_none=True)
    if req.stop:
        params["stop"] = req.stop_list()
    if req.seed is not None:
        params["sampling_seed"] = req.seed
    return params


async def run_turn(
    state: RouterState, session: Session | None, plan: TurnPlan, params: dict, extra: dict | None = None
) -> list[Generation]:
    gens = await state.runner.generate(session, plan.input_ids, params, extra or {})
    if any(g.finish_type == "abort" for g in gens):
        raise APIError(503, "the engine aborted the generation", type="server_error", code="generation_aborted")
    return gens


def forced_start(renderer: ChatRenderer, req: ChatRequest) -> tuple[list[int], str]:
    """(ids, text) that `tool_choice` forces the reply to begin with, appended to the prompt
    instead of constraining decoding: a named function's call up to its arguments, the opening of
    any call for "required", nothing for "auto"/"none"."""
    try:
        if isinstance(req.tool_choice, NamedToolChoice):
            return renderer.tool_call_opening(req.tool_choice.function["name"])
        if req.tool_choice == "required":
            return renderer.tool_call_opening(None)
    except TemplateError as e:
        raise APIError(400, str(e), param="tool_choice") from None
    return [], ""


def assistant_message(state: RouterState, gen: Generation, parse_tools: bool, forced: str = "") -> dict:
    """The reply to the agent: the forced start (see `forced_start`) and the sampled text, parsed."""
    text = forced + gen.text
    if not parse_tools:
        return {"role": "assistant", "content": text}
    parsed = parse_tool_calls(text)
    if parsed.parse_error:
        state.metrics.tool_parse_failures.inc()
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["tool_calls"] = parsed.tool_calls
    return message


def stream_response(
    state: RouterState, turn: InFlight, plan: TurnPlan, events, result: StreamedTurn, usage_chunk, started
) -> StreamingResponse:
    """Send `events`, then record the turn (once the whole output is known), usage and [DONE]."""
    turn.handed_off = True

    async def body() -> AsyncIterator[bytes]:
        try:
            async for event in _recorded(state, turn, plan, events, result, usage_chunk, started):
                yield event
        finally:
            turn.end()

    return StreamingResponse(body(), media_type="text/event-stream")


async def _recorded(
    state: RouterState, turn: InFlight, plan: TurnPlan, events, result: StreamedTurn, usage_chunk, started: float
) -> AsyncIterator[bytes]:
    """The stream's events; errors after the first byte are sent as an OpenAI error event."""
    session = turn.session
    try:
        async for event in events:
            yield event
    except EngineFailedMidStream as e:
        yield sse(APIError(502, str(e), type="server_error", code="engine_failed").body())
        return
    if any(g.finish_type == "abort" for g in result.generations):
        yield sse(APIError(503, "the engine aborted the generation", type="server_error").body())
        return
    if session is not None:  # before the finish reasons, so the agent's next turn sees this one
        try:
            await state.runner.record(session, plan, result.generations, result.answers, started)
        except Exception as e:  # a refusal, or the store unreachable, is told in the stream
            if (error := known_error(e)) is None:
                raise
            yield sse(error.body())
            return
    for event in result.closing:
        yield event
    if usage_chunk is not None:
        prompt = len(plan.input_ids)
        yield sse({**usage_chunk, "choices": [], "usage": R.usage(prompt, result.generations)})
    yield b"data: [DONE]\n\n"


async def engine_chunks(
    state: RouterState, session: Session | None, plan: TurnPlan, params: dict, extra: dict
) -> AsyncIterator[tuple[dict, str]]:
    """The engine stream, started here so that failures before any output are HTTP errors."""
    chunks = state.runner.stream(session, plan.input_ids, params, extra)
    first = await anext(chunks)

    async def rest() -> AsyncIterator[tuple[dict, str]]:
        yield first
        async for chunk in chunks:
            yield chunk

    return rest()


def stream_head(req: SamplingFields, state: RouterState, prefix: str, obj: str) -> dict:
    return {"id": R.new_id(prefix), "object": obj, "created": int(time.time()), "model": req.model or state.model_name}


TurnHandler = Callable[[RouterState, InFlight, dict, float], Awaitable[Response]]


async def serve_turn(request: Request, api_key: str | None, handler: TurnHandler) -> Response:
    """An OpenAI endpoint's turn: resolve the session, count the turn in flight on it, hand `handler` the body."""
    state, started = get_state(request), time.time()
    session = resolve_session(state, request, api_key)
    with in_flight(session) as turn:
        return await handler(state, turn, await read_json(request), started)


async def chat_completions(request: Request, api_key: str | None = None) -> Response:
    return await serve_turn(request, api_key, _chat)


async def completions(request: Request, api_key: str | None = None) -> Response:
    return await serve_turn(request, api_key, _completion)


async def _chat(state: RouterState, turn: InFlight, body: dict, started: float) -> Response:
    session = turn.session
    req: ChatRequest = parse(ChatRequest, body)
    tools = body.get("tools") or None
    capture = session.capture if session else Capture(state.renderer)
    try:
        plan = capture.plan_chat(body["messages"], tools, validate_messages)
    except TemplateError as e:
        raise APIError(400, str(e), param="messages") from None
    forced_ids, forced = forced_start(state.renderer, req)
    plan = plan.with_forced(forced_ids)
    params = sampling_params(state, session, req, req.new_tokens(), len(plan.input_ids))
    extra = {"top_logprobs_num": req.top_logprobs} if req.logprobs and req.top_logprobs else {}
    parse_tools = bool(tools) and req.tool_choice != "none"
    if req.stream:
        return await stream_chat(state, turn, plan, req, params, extra, parse_tools, forced, started)
    gens = await run_turn(state, session, plan, params, extra)
    messages = [assistant_message(state, g, parse_tools, forced) for g in gens]
    logprobs = [R.chat_logprobs(state.renderer, g) for g in gens] if req.logprobs else None
    out = R.chat_completion(req.model or state.model_name, messages, gens, len(plan.input_ids), logprobs)
    if session is not None:
        await state.runner.record(session, plan, gens, messages, started)
    return R.json_response(out)


async def stream_chat(
    state, turn: InFlight, plan, req: ChatRequest, params, extra, parse_tools, forced: str, started
) -> Response:
    chunks = await engine_chunks(state, turn.session, plan, params, extra)
    head = stream_head(req, state, "chatcmpl", "chat.completion.chunk")
    result = StreamedTurn()
    lp = (lambda entries: R.stream_logprobs(state.renderer, entries)) if req.logprobs else None
    events = chat_events(
        chunks, head, req.n, parse_tools, params.get("stop", []),
        lambda g: assistant_message(state, g, parse_tools, forced),
        lp, result, forced=forced,
    )  # fmt: skip
    usage_chunk = head if req.stream_options and req.stream_options.include_usage else None
    return stream_response(state, turn, plan, events, result, usage_chunk, started)


async def _completion(state: RouterState, turn: InFlight, body: dict, started: float) -> Response:
    session = turn.session
    req: CompletionRequest = parse(CompletionRequest, body)
    capture = session.capture if session else Capture(state.renderer)
    prompt = req.prompt
    text_prompt = isinstance(prompt, str)
    plan = capture.plan_text(prompt) if isinstance(prompt, str) else capture.plan_tokens(prompt)
    params = sampling_params(state, session, req, req.max_tokens, len(plan.input_ids))
    if req.stream:
        chunks = await engine_chunks(state, session, plan, params, {})
        head, result = stream_head(req, state, "cmpl", "text_completion"), StreamedTurn()
        events = completion_events(chunks, head, req.n, params.get("stop", []), result)
        if not text_prompt:
            events = _no_answers(events, result)
        usage_chunk = head if req.stream_options and req.stream_options.include_usage else None
        return stream_response(state, turn, plan, events, result, usage_chunk, started)
    gens = await run_turn(state, session, plan, params)
    texts = [g.text for g in gens]
    logprobs = [R.completion_logprobs(state.renderer, g) for g in gens] if req.logprobs is not None else None
    out = R.text_completion(req.model or state.model_name, texts, gens, len(plan.input_ids), logprobs)
    if session is not None:
        answers: list = texts if text_prompt else [None] * len(gens)
        await state.runner.record(session, plan, gens, answers, started)
    return R.json_response(out)


async def _no_answers(events: AsyncIterator[bytes], result: StreamedTurn) -> AsyncIterator[bytes]:
    """A token-id prompt continues by tokens, not by text: record no text answer."""
    async for event in events:
        yield event
    result.answers = [None] * len(result.answers)


@api.get("/v1/models")
@api.get("/s/{api_key}/v1/models")
async def models(request: Request, api_key: str | None = None) -> dict:
    state = get_state(request)
    if api_key is not None:
        session_for_key(state, api_key)
    entry = {"id": state.model_name, "object": "model", "created": 0, "owned_by": "slimeish"}
    return {"object": "list", "data": [{**entry, "max_model_len": state.context_length}]}


async def generate(request: Request, api_key: str | None) -> Response:
    """Token-in path: an SGLang /generate body (single prompt of `input_ids`), captured; only
    reached with a session key in the path."""
    state, started = get_state(request), time.time()
    session = session_for_key(state, api_key)
    with in_flight(session):
        return await _generate(state, session, await read_json(request), started)


async def _generate(state: RouterState, session: Session, body: dict, started: float) -> Response:
    ids = body.get("input_ids")
    if not (isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
        raise APIError(400, "the token-in path takes one prompt as `input_ids`: a non-empty list of ints")
    if body.get("stream"):
        raise APIError(400, "stream is not supported on the token-in path", param="stream")
    plan = session.capture.plan_tokens(ids)
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise APIError(400, "sampling_params must be a JSON object", param="sampling_params")
    params = session.sampling_defaults | params  # the body's own values win
    forwarded = {k: v for k, v in body.items() if k not in ("input_ids", "text", "sampling_params", "return_logprob")}
    gens = await run_turn(state, session, plan, params, forwarded)
    await state.runner.record(session, plan, gens, [None] * len(gens), started)
    items = [g.raw for g in gens]
    return R.json_response(items if len(items) > 1 else items[0])
