"""The one interface between a dialect and the turn pipeline, and the endpoint that runs it.

A dialect is one module: a `Dialect` that parses its API's request body into a `DialectTurn`
(the `Conversation` capture takes, and how its answer reads) and tells an error mid-stream in its
API's shape. `endpoint(dialect)` does everything else the same way for every dialect: the
session, capture, the engine call, recording, stream framing and errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from fastapi import Request
from fastapi.responses import Response

from slimeish.router.engine_api import EngineChunks
from slimeish.router.errors import APIError
from slimeish.router.jsontypes import JSONObject
from slimeish.router.openai_bodies import json_response
from slimeish.router.pipeline import (
    Conversation,
    InFlight,
    PlannedTurn,
    StreamShape,
    engine_chunks,
    generate_replies,
    plan_turn,
    record,
    serve_turn,
    stream_response,
)
from slimeish.router.sessions import Session
from slimeish.router.state import RouterState
from slimeish.router.streaming import StreamedTurn
from slimeish.router.turns import Generation


class DialectTurn(Protocol):
    """One request of a dialect, parsed: what it hands the capture path, and how it answers."""

    @property
    def stream(self) -> bool: ...

    @property
    def conversation(self) -> Conversation: ...

    @property
    def engine_extra(self) -> JSONObject:
        """/generate fields beyond the sampling params (chat's `top_logprobs_num`); usually {}."""
        ...

    def answer(
        self, state: RouterState, planned: PlannedTurn, gens: list[Generation], replies: list[JSONObject]
    ) -> JSONObject:
        """The non-streamed response body: `replies[i]` is the assistant message of `gens[i]`."""
        ...

    def events(
        self, state: RouterState, planned: PlannedTurn, chunks: EngineChunks, result: StreamedTurn
    ) -> AsyncIterator[bytes]:
        """The stream's events while the engine generates; at the end, fills `result` (its
        generations and answers, and the closing events, sent once the turn is recorded)."""
        ...

    def keepalive(self) -> bytes:
        """An event the client decodes and ignores, sent while the engine is silent."""
        ...

    def error_event(self, error: APIError) -> bytes:
        """An error after the stream started (the engine's failure, a refused record), as the API's
        stream tells it. Errors before it are HTTP errors in the API's shape (`errors.error_response`)."""
        ...

    def recorded(self, body: JSONObject, answers: list[JSONObject]) -> None:
        """What the dialect keeps once the turn is recorded (Responses' stored responses): `body` is
        the response, `answers` the assistant messages."""
        ...


class Dialect(Protocol):
    def turn(self, state: RouterState, session: Session | None, body: JSONObject) -> DialectTurn:
        """The request body parsed: a 4xx `APIError` when it is not valid."""
        ...


Endpoint = Callable[[Request, str | None], Awaitable[Response]]


def endpoint(dialect: Dialect) -> Endpoint:
    """The route handler of `dialect`: `(request, api_key)`, the key from a session's base URL or None."""

    async def handle(state: RouterState, turn: InFlight, body: JSONObject, started: float) -> Response:
        asked = dialect.turn(state, turn.session, body)
        planned = await plan_turn(state, turn.session, asked.conversation)
        if asked.stream:
            patience = state.config.stream_keepalive or None  # past it, the stream opens and keeps alive
            engine = await engine_chunks(
                state, turn.session, planned.plan, planned.params, asked.engine_extra, patience
            )
            result = StreamedTurn()
            events = asked.events(state, planned, engine.chunks, result)
            result.on_recorded.append(lambda: asked.recorded(result.body, result.answers))
            shape = StreamShape(asked.error_event, asked.keepalive)
            return stream_response(state, turn, planned.plan, events, result, started, shape, engine.overdue)
        gens, replies = await generate_replies(state, turn.session, planned, asked.engine_extra)
        out = asked.answer(state, planned, gens, replies)
        await record(state, turn, planned.plan, gens, replies, started)
        asked.recorded(out, replies)
        return json_response(out)

    async def serve(request: Request, api_key: str | None = None) -> Response:
        return await serve_turn(request, api_key, handle)

    return serve
