"""OpenAI's other endpoints (`/v1/completions`, `/v1/models`, `GET /v1/responses/{id}`) and the token-in `/generate`.

The dialects agents converse in (chat, Responses, Messages) live in `slimeish.router.dialects`; the
turn endpoints here share their pipeline (`slimeish.router.pipeline`) and are dispatched ahead of
FastAPI by `slimeish.router.dispatch`; `/v1/models` is an ordinary route.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

from fastapi import APIRouter, Request
from fastapi.responses import Response

from slimeish.router import openai_bodies as R
from slimeish.router.dialects.responses import stored_response
from slimeish.router.engine_api import SamplingParams
from slimeish.router.errors import APIError
from slimeish.router.jsontypes import JSONObject
from slimeish.router.limits import check_context, off_loop_if_large
from slimeish.router.pipeline import (
    InFlight,
    StreamShape,
    engine_chunks,
    parse,
    record,
    resolve_session,
    run_turn,
    sampling_params,
    serve_turn,
    stream_response,
)
from slimeish.router.schemas import CompletionRequest, check_n
from slimeish.router.state import RouterState, get_state
from slimeish.router.streaming import StreamedTurn, completion_events, openai_closed, sse

api = APIRouter()
_SHAPE = StreamShape(lambda e: sse(e.body()))


async def completions(request: Request, api_key: str | None = None) -> Response:
    return await serve_turn(request, api_key, _completion)


async def _completion(state: RouterState, turn: InFlight, body: JSONObject, started: float) -> Response:
    session = turn.session
    req: CompletionRequest = parse(CompletionRequest, body)
    capture = session.capture if session else state.sessions.new_capture()
    prompt = req.prompt
    text_prompt = isinstance(prompt, str)
    if isinstance(prompt, str):
        await check_context([prompt], state.tokenizer, state.token_chars, state.context_length)
        plan = await off_loop_if_large(len(prompt), lambda: capture.plan_text(prompt))
    else:
        plan = capture.plan_tokens(prompt)
    params = sampling_params(state, session, req, req.max_tokens, len(plan.input_ids))
    if req.stream:
        chunks = (await engine_chunks(state, session, plan, params, {})).chunks  # no keep-alive: it waits
        head, result = R.stream_head(req.model or state.model_name, "cmpl", "text_completion"), StreamedTurn()
        events = completion_events(chunks, head, req.n, params.get("stop", []), result)
        if not text_prompt:
            events = _no_answers(events, result)
        usage_head = head if req.stream_options and req.stream_options.include_usage else None
        events = openai_closed(events, result, usage_head, len(plan.input_ids))
        return stream_response(state, turn, plan, events, result, started, _SHAPE)
    gens = await run_turn(state, session, plan, params)
    texts = [g.text for g in gens]
    logprobs = [R.completion_logprobs(state.renderer, g) for g in gens] if req.logprobs is not None else None
    out = R.text_completion(req.model or state.model_name, texts, gens, len(plan.input_ids), logprobs)
    await record(state, turn, plan, gens, texts if text_prompt else [None] * len(gens), started)
    return R.json_response(out)


async def _no_answers(events: AsyncIterator[bytes], result: StreamedTurn) -> AsyncIterator[bytes]:
    """A token-id prompt continues by tokens, not by text: record no text answer."""
    async for event in events:
        yield event
    result.answers = [None] * len(result.answers)


@api.get("/v1/models")
@api.get("/s/{api_key}/v1/models")
async def models(request: Request, api_key: str | None = None) -> JSONObject:
    state = get_state(request)
    if api_key is not None:
        resolve_session(state, request, api_key)
    entry = {"id": state.model_name, "object": "model", "created": 0, "owned_by": "slimeish"}
    return {"object": "list", "data": [{**entry, "max_model_len": state.context_length}]}


@api.get("/v1/responses/{response_id}")
@api.get("/s/{api_key}/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str, api_key: str | None = None) -> Response:
    """A response the session stored (Responses' `store`, the default), as it was answered."""
    session = resolve_session(get_state(request), request, api_key)
    return Response(stored_response(session, response_id), media_type="application/json")


async def generate(request: Request, api_key: str | None) -> Response:
    """Token-in path: an SGLang /generate body (single prompt of `input_ids`), captured; only
    reached with a session key in the path."""
    return await serve_turn(request, api_key, _generate)


async def _generate(state: RouterState, turn: InFlight, body: JSONObject, started: float) -> Response:
    session = turn.session
    assert session is not None  # the dispatcher routes /generate with a key in the path only
    ids = body.get("input_ids")
    # ints and no bools, checked in C: a generator over every id was 4 % of the router's token-in time
    if not (isinstance(ids, list) and ids and set(map(type, ids)) == {int}):
        raise APIError(400, "the token-in path takes one prompt as `input_ids`: a non-empty list of ints")
    if body.get("stream"):
        raise APIError(400, "stream is not supported on the token-in path", param="stream")
    if len(ids) >= state.context_length:
        raise APIError(
            400,
            f"this model's maximum context length is {state.context_length} tokens; the prompt has {len(ids)}",
            param="input_ids",
            code="context_length_exceeded",
        )
    plan = session.capture.plan_tokens(ids)
    sent = body.get("sampling_params") or {}
    if not isinstance(sent, dict):
        raise APIError(400, "sampling_params must be a JSON object", param="sampling_params")
    # typed here, at the edge; SGLang fields the router does not name are passed on as sent
    params: SamplingParams = session.identity.sampling_defaults | cast(
        SamplingParams, sent
    )  # the body's own values win
    check_n(params)
    forwarded = {k: v for k, v in body.items() if k not in ("input_ids", "text", "sampling_params", "return_logprob")}
    gens = await run_turn(state, session, plan, params, forwarded)
    await record(state, turn, plan, gens, [None] * len(gens), started)
    items = [g.raw for g in gens]
    return R.json_response(items if len(items) > 1 else items[0])
