"""One turn of any dialect: its request as a `Conversation`, planned by capture, generated, answered, recorded.

Every agent-facing endpoint follows the same steps: resolve the session from its key, validate,
plan the turn's tokens (capture), check the context window, generate on an engine, answer the
agent, then commit the turn and write it through to the store. A dialect (`slimeish.router.dialects`)
only converts: its request into a `Conversation` (chat messages the renderer takes, chat-format
tools, sampling) and the turn's generations into its response body and stream events.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from slimeish.router.capture import TurnPlan, Validator
from slimeish.router.engine_api import EngineChunks, SamplingParams
from slimeish.router.engine_http import GenerationAborted
from slimeish.router.errors import APIError, from_validation_error, known_error
from slimeish.router.jsontypes import JSONObject
from slimeish.router.limits import check_context, check_message_count, off_loop_if_large, verbatim_texts
from slimeish.router.renderers.base import Renderer, TemplateError, reply_message
from slimeish.router.schemas import NamedToolChoice, SamplingFields, ToolChoice
from slimeish.router.sessions import Session
from slimeish.router.state import RouterState, get_state
from slimeish.router.streaming import StreamedTurn
from slimeish.router.turns import Answer, Generation

KEY_PREFIX = "sk-slimeish-"


def _validated(messages: list[JSONObject], start: int) -> None:
    """The validator of a dialect that validated its whole request while converting it."""


@dataclass
class Conversation:
    """What every dialect's request becomes, the one input of capture."""

    messages: list[Any]  # chat messages as the renderer takes them
    tools: list[JSONObject] | None  # chat-format function tools
    sampling: SamplingFields
    max_tokens: int | None
    tool_choice: ToolChoice = None
    validate: Validator = _validated  # chat validates lazily: only messages a turn adds


@dataclass
class PlannedTurn:
    plan: TurnPlan
    params: SamplingParams
    forced: str  # the reply's start that tool_choice forced (appended to the prompt)
    parse_tools: list[JSONObject] | None  # the tools whose calls the reply is parsed for; None: calls are content


M = TypeVar("M", bound=BaseModel)


async def read_json(request: Request) -> dict[str, Any]:
    return loads_json(await request.body())


def loads_json(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise APIError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    return body


def parse(model: type[M], body: JSONObject) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise from_validation_error(e) from None


def bearer_token(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else ""


def request_keys(request: Request) -> list[str]:
    """Every credential a client sent, most specific first: `X-Session-ID` (harnesses that share one
    base URL among rollouts and name each rollout in a header; their SDK's own key is a placeholder
    then), `Authorization: Bearer` (OpenAI), `x-api-key` (Anthropic), `x-goog-api-key` / `?key=` (Gemini)."""
    headers = request.headers
    sent = [headers.get("x-session-id", ""), bearer_token(request), headers.get("x-api-key", "")]
    query = request.query_params.get("key", "") if request.scope.get("query_string") else ""  # most have none to parse
    sent += [headers.get("x-goog-api-key", ""), query]
    return [key.strip() for key in sent if key.strip()]


def request_key(request: Request) -> str:
    """The credential that names the client's session (the first of `request_keys`), or ""."""
    return next(iter(request_keys(request)), "")


def resolve_session(state: RouterState, request: Request, path_key: str | None) -> Session | None:
    """The session owning the key (URL path or header), None for an allowed anonymous call. A
    session key in the header that is not the URL's is refused like a wrong key: a credential that
    contradicts the URL, or headers naming two sessions, are a client's bug (or a leak), not something
    to guess about. Any other header value is the placeholder SDKs send with a base URL that carries
    the key, and is ignored."""
    keys = request_keys(request)
    named = {key for key in keys if key.startswith(KEY_PREFIX) or state.sessions.knows(key)}
    session = session_for_key(state, path_key) if path_key is not None else None
    if len(named | ({path_key} if path_key else set())) > 1:
        raise APIError(
            401,
            "the request's URL and headers hold the keys of different sessions",
            type="authentication_error",
            code="invalid_api_key",
        )
    if session is not None:
        return session
    key = next(iter(keys), "")
    if state.config.allow_anonymous and not key.startswith(KEY_PREFIX) and not state.sessions.knows(key):
        return None
    return session_for_key(state, key)


def session_for_key(state: RouterState, key: str | None) -> Session:
    """The open session owning `key`: 401 when none does, 409 when it is finished."""
    session = state.sessions.by_api_key(key) if key else None
    if session is None and key and (closed := state.sessions.closed_by_key.get(key)):
        raise APIError(409, f"session {closed.identity.session_id} is finished", code="session_finished")
    if session is None:
        raise APIError(401, "unknown or missing session key", type="authentication_error", code="invalid_api_key")
    if session.closed:
        raise APIError(409, f"session {session.identity.session_id} is finished", code="session_finished")
    return session


@dataclass
class InFlight:
    """A turn counted as in flight on its session until recorded or failed (a finish waits for
    it). A streamed turn is handed to its response body, which ends it when the stream ends."""

    session: Session | None
    request: Request | None = None  # to tell whether the client is still there to receive the answer
    handed_off: bool = False
    ended: bool = False

    def end(self) -> None:
        if self.session is not None and not self.ended:
            self.ended = True
            self.session.end_turn()


@contextlib.contextmanager
def in_flight(session: Session | None, request: Request | None = None) -> Iterator[InFlight]:
    if session is not None:
        session.begin_turn()
    turn = InFlight(session, request)
    try:
        yield turn
    finally:
        if not turn.handed_off:
            turn.end()


TurnHandler = Callable[[RouterState, InFlight, JSONObject, float], Awaitable[Response]]


async def serve_turn(request: Request, api_key: str | None, handler: TurnHandler) -> Response:
    """A turn endpoint: resolve the session, count the turn in flight on it, hand `handler` the body.
    An SDK's retry of the session's last non-streamed request gets that request's answer again."""
    state, started = get_state(request), time.time()
    session = resolve_session(state, request, api_key)
    raw = await request.body()
    if session is not None:
        await state.runner.confirm(session)  # a turn whose write failed is revoked first
        if (answer := replayed(session, request, raw)) is not None:
            return answer
    body = loads_json(raw)
    check_message_count(body, state.config.max_messages)
    with in_flight(session, request) as turn:
        response = await handler(state, turn, body, started)
    if session is not None and not isinstance(response, StreamingResponse):
        session.memory.last_answer = (raw, bytes(response.body), response.media_type)
    return response


def replayed(session: Session, request: Request, raw: bytes) -> Response | None:
    """The recorded answer to this same request, when the SDK says it is retrying it
    (`x-stainless-retry-count`, sent by the openai and anthropic SDKs): the stored turn whose
    answer the client missed, so the episode stays one trajectory (a second turn would fork it).
    A turn answered with an error is not stored, so its retry is generated anew."""
    retry = request.headers.get("x-stainless-retry-count", "0") not in ("", "0")
    last = session.memory.last_answer
    if not retry or last is None or last[0] != raw:
        return None
    _, body, media_type = last
    return Response(body, media_type=media_type, headers={"x-slimeish-replayed": "true"})


def sampling_params(
    state: RouterState, session: Session | None, req: SamplingFields, max_tokens: int | None, prompt_len: int
) -> SamplingParams:
    """SGLang sampling params: the request's, else the session's defaults (else the engine's); the
    context check of an explicit `max_tokens` gives OpenAI's `context_length_exceeded`, a default
    budget is capped by the room left."""
    defaults: SamplingParams = session.identity.sampling_defaults.copy() if session else {}
    budget = defaults.pop("max_new_tokens", None) or state.config.default_max_tokens
    room = state.context_length - prompt_len
    if room <= 0 or (max_tokens is not None and max_tokens > room):
        # Worded as Anthropic's API words it too: Claude Code, which asks for 128k output tokens by
        # default, reads the three numbers from this text and retries with a `max_tokens` that fits.
        raise APIError(
            400,
            f"this model's maximum context length is {state.context_length} tokens; the prompt has "
            f"{prompt_len} and {max_tokens or 1} more were requested (input length and `max_tokens` exceed "
            f"context limit: {prompt_len} + {max_tokens or 1} > {state.context_length}, decrease input length "
            "or `max_tokens` and try again)",
            param="messages",
            code="context_length_exceeded",
        )
    params: SamplingParams = {"max_new_tokens": max_tokens or min(room, budget), "n": req.n}
    params.update(defaults)
    if req.temperature is not None:
        params["temperature"] = req.temperature
    if req.top_p is not None:
        params["top_p"] = req.top_p
    if req.top_k is not None:
        params["top_k"] = req.top_k
    if req.stop:
        params["stop"] = req.stop_list()
    if req.seed is not None:
        params["sampling_seed"] = req.seed
    return params


def forced_start(renderer: Renderer, tool_choice: ToolChoice) -> tuple[list[int], str]:
    """(ids, text) that `tool_choice` forces the reply to begin with, appended to the prompt
    instead of constraining decoding: a named function's call up to its arguments, the opening of
    any call for "required", nothing for "auto"/"none"."""
    try:
        if isinstance(tool_choice, NamedToolChoice):
            return renderer.tool_call_opening(tool_choice.function["name"])
        if tool_choice == "required":
            return renderer.tool_call_opening(None)
    except TemplateError as e:
        raise APIError(400, str(e), param="tool_choice") from None
    return [], ""


async def plan_turn(state: RouterState, session: Session | None, conv: Conversation) -> PlannedTurn:
    """The turn's tokens (capture: extend a segment or start one), then its sampling params. A
    prompt that cannot fit is refused before it is rendered; a large one is rendered off the loop."""
    capture = session.capture if session else state.sessions.new_capture()
    texts = verbatim_texts(conv.messages)
    await check_context(texts, state.tokenizer, state.token_chars, state.context_length)
    chars = sum(map(len, texts))
    try:
        plan = await off_loop_if_large(chars, lambda: capture.plan_chat(conv.messages, conv.tools, conv.validate))
    except TemplateError as e:
        raise APIError(400, str(e), param="messages") from None
    forced_ids, forced = forced_start(state.renderer, conv.tool_choice)
    plan = plan.with_forced(forced_ids)
    params = sampling_params(state, session, conv.sampling, conv.max_tokens, len(plan.input_ids))
    return PlannedTurn(plan, params, forced, conv.tools if conv.tools and conv.tool_choice != "none" else None)


def assistant_message(
    state: RouterState, gen: Generation, parse_tools: list[JSONObject] | None, forced: str = ""
) -> JSONObject:
    """The reply to the agent: the forced start (see `forced_start`) and the sampled tokens, parsed
    by the model family's renderer. The parse outcome is kept on `gen`, which the turn records."""
    renderer = state.renderer
    parsed = renderer.parse(forced, gen.output_ids, gen.text, gen.finish_type, parse_tools)
    gen.parse_failure, gen.tool_calls = parsed.failure, len(parsed.tool_calls)
    if parsed.failure:
        state.metrics.tool_parse_failed(renderer.family, parsed.failure)
    return reply_message(parsed)


async def run_turn(
    state: RouterState, session: Session | None, plan: TurnPlan, params: SamplingParams, extra: JSONObject | None = None
) -> list[Generation]:
    gens = await state.runner.generate(session, plan.input_ids, params, extra or {})
    check_not_aborted(gens)
    return gens


def check_not_aborted(gens: list[Generation]) -> None:
    """The one check of an engine abort, streamed or not, so both answer the same error."""
    if any(g.finish_type == "abort" for g in gens):
        raise GenerationAborted("the engine aborted the generation")


async def generate_replies(
    state: RouterState, session: Session | None, turn: PlannedTurn, extra: JSONObject | None = None
) -> tuple[list[Generation], list[JSONObject]]:
    """A non-streamed turn: the generations and the assistant message each one answers."""
    gens = await run_turn(state, session, turn.plan, turn.params, extra)
    return gens, [assistant_message(state, g, turn.parse_tools, turn.forced) for g in gens]


@dataclass
class EngineStream:
    chunks: EngineChunks
    overdue: bool  # no chunk came within the patience: the client is owed a keep-alive as the stream opens


async def engine_chunks(
    state: RouterState,
    session: Session | None,
    plan: TurnPlan,
    params: SamplingParams,
    extra: JSONObject,
    patience: float | None = None,
) -> EngineStream:
    """The engine stream, started here so that failures before any output are HTTP errors (which
    SDKs retry), for up to `patience` seconds (a stream's keep-alive interval; None: however long
    the first chunk takes). A longer prefill (15k-token harness prompts) opens the stream before
    its first chunk, so that its client hears keep-alives through the prefill, not silence."""
    chunks = state.runner.stream(session, plan.input_ids, params, extra)
    first = asyncio.ensure_future(anext(chunks))
    try:
        done, _ = await asyncio.wait({first}, timeout=patience)
    except BaseException:  # the request was cancelled (its client went away): so is the engine call
        first.cancel()
        raise
    if done:
        first.result()  # the engine's failure before any output, raised here: an HTTP error

    async def rest() -> EngineChunks:
        try:
            yield await first
            async for chunk in chunks:
                yield chunk
        finally:
            first.cancel()

    return EngineStream(rest(), overdue=not done)


ErrorEvent = Callable[[APIError], bytes]


@dataclass
class StreamShape:
    """How a dialect's stream tells an error, and keeps an idle client listening."""

    error: ErrorEvent
    keepalive: Callable[[], bytes] | None = None


def stream_response(
    state: RouterState,
    turn: InFlight,
    plan: TurnPlan,
    events: AsyncIterator[bytes],
    result: StreamedTurn,
    started: float,
    shape: StreamShape,
    overdue: bool = False,
) -> StreamingResponse:
    """Send `events`, then record the turn (once the whole output is known), then `result.closing`.
    `overdue`: the client already waited a keep-alive interval (`EngineStream.overdue`)."""
    turn.handed_off = True

    async def body() -> AsyncIterator[bytes]:
        try:
            async for event in _recorded(state, turn, plan, events, result, started, shape, overdue):
                yield event
        finally:
            turn.end()

    return StreamingResponse(body(), media_type="text/event-stream")


async def _recorded(
    state: RouterState,
    turn: InFlight,
    plan: TurnPlan,
    events: AsyncIterator[bytes],
    result: StreamedTurn,
    started: float,
    shape: StreamShape,
    overdue: bool,
) -> AsyncIterator[bytes]:
    """The stream's events; errors after the first byte are sent as the dialect's error event."""
    session = turn.session

    async def then_record() -> AsyncIterator[bytes]:  # the write, too, is kept alive: the store may be slow
        async for event in events:
            yield event
        check_not_aborted(result.generations)
        if session is not None:  # before the finish reasons, so the agent's next turn sees this one
            await state.runner.record(session, plan, result.generations, result.answers, started)

    try:
        async for event in with_keepalive(then_record(), shape.keepalive, state.config.stream_keepalive, overdue):
            yield event
    except Exception as e:  # the engine's failure, a refusal, or the store unreachable: told in the stream
        if (error := known_error(e)) is None:
            raise
        yield shape.error(error)
        return
    for then in result.on_recorded:
        then()
    for event in result.closing:
        yield event


async def with_keepalive(
    events: AsyncIterator[bytes], keepalive: Callable[[], bytes] | None, every: float, overdue: bool = False
) -> AsyncIterator[bytes]:
    """`events`, with `keepalive` sent whenever `every` seconds pass without one: clients with
    idle watchdogs decode it as an event, so a long prefill or generation is not dropped.
    `overdue`: the client has waited `every` already, so the first keep-alive goes out as soon as
    the events ready without waiting (the dialect's opening events, which some SDKs need first:
    `response.created`) are out."""
    if keepalive is None or every <= 0:
        async for event in events:
            yield event
        return
    pending = asyncio.ensure_future(anext(events))
    try:
        while True:
            if overdue:  # one turn of the loop runs `pending`'s first step: an event that needs no wait is done
                await asyncio.sleep(0)
            done, _ = await asyncio.wait({pending}, timeout=0 if overdue else every)
            if not done:
                overdue = False
                yield keepalive()
                continue
            try:
                event = pending.result()
            except StopAsyncIteration:
                return
            yield event
            pending = asyncio.ensure_future(anext(events))
    finally:
        pending.cancel()


def client_gone(request: Request) -> bool:
    """Whether the client has disconnected, told without waiting. Once the body is read, the next
    ASGI message can only be `http.disconnect`, which the server hands over at once when the
    connection is gone: so one step of `receive()` tells, done (gone) or about to wait (still
    there, the step is closed). Starlette's `is_disconnected` waits inside a cancelled anyio cancel
    scope instead, which cost a loop turn and a task repr: ~10 % of a token-in turn's router CPU."""
    step = request.receive().__await__()
    try:
        step.send(None)
    except StopIteration as done:
        return bool(done.value.get("type") == "http.disconnect")
    step.close()
    return False


async def record(
    state: RouterState,
    turn: InFlight,
    plan: TurnPlan,
    gens: list[Generation],
    answers: Sequence[Answer],
    started: float,
) -> None:
    """Record a non-streamed turn before it is answered, unless its client went away: an answer
    nobody received must not become a training sample (the SDK's retry, answered anew, is the
    turn). A store that cannot take it raises StoreUnavailable (503): nothing is stored."""
    if turn.session is None:
        return
    if turn.request is not None and client_gone(turn.request):
        raise APIError(499, "the client went away before its answer; the turn is not recorded", code="client_gone")
    await state.runner.record(turn.session, plan, gens, answers, started)
