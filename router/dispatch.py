"""The agent-facing turn endpoints, dispatched as plain ASGI ahead of FastAPI's request path.

Every agent turn passes through here, so this path's cost is the router's cost per turn. FastAPI's
own path (five middlewares, dependency solving, a wrapper around every `send`) was about a
quarter of the router's CPU time per chat turn (py-spy, docs/benchmarks.md). The POST routes
below are matched on the path string and answered by each dialect's handler
(`slimeish.router.dialects`) or `slimeish.router.api_v1`, with the same error bodies
(`as_api_error`, in the shape of the path's API) and metrics as every other endpoint. All other
requests (sessions, admin, `/v1/models`, `/metrics`, `/health`, the OpenAPI docs) go through
FastAPI as usual. A session path with caller segments before its API path is first read as the
session's own (`without_caller_segments`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from slimeish.router.api_v1 import completions, generate
from slimeish.router.dialects.chat import chat_completions
from slimeish.router.dialects.gemini import gemini_route
from slimeish.router.dialects.messages import count_tokens, messages
from slimeish.router.dialects.responses import responses
from slimeish.router.errors import APIError, as_api_error, error_response
from slimeish.router.limits import capped, declared_too_large, too_large
from slimeish.router.native import engine_generate

TurnEndpoint = Callable[[Request, str | None], Awaitable[Response]]

# Served with a session key in the path (`/s/<key>...`) or in a header (X-Session-ID, Bearer, x-api-key).
_AGENT_APIS: dict[str, TurnEndpoint] = {
    "/v1/chat/completions": chat_completions,
    "/v1/completions": completions,
    "/v1/responses": responses,
    "/v1/messages": messages,
    "/v1/messages/count_tokens": count_tokens,
}
# The root /generate is SGLang's native path, forwarded uncaptured (router/native.py); under a
# session's path it is the captured token-in endpoint.
_ANONYMOUS: dict[str, TurnEndpoint] = {**_AGENT_APIS, "/generate": engine_generate}
_PER_SESSION: dict[str, TurnEndpoint] = {**_AGENT_APIS, "/generate": generate}


def _route(table: dict[str, TurnEndpoint], path: str) -> tuple[str, TurnEndpoint] | None:
    """(endpoint, handler): a path of `table`, or Gemini's `/v1beta/models/{model}:{method}`."""
    handler = table.get(path)
    return (path, handler) if handler else gemini_route(path)


# The first segment of every API path under a session: OpenAI's and Anthropic's `v1`, Gemini's `v1beta`.
_API_VERSIONS = frozenset({"v1", "v1beta"})


def without_caller_segments(path: str) -> str:
    """`/s/<key>/<caller segments>/<API path>` as `/s/<key>/<API path>`: a harness that carries its own
    run coordinates in the base URL it hands a rollout (rLLM's `/meta/<slug>/v1`, NeMo-Gym's rollout
    prefix, `/s/<key>/runs/7/rollout/3/v1`) reaches the session's own API, with its key and auth. The
    API path is a last `generate` segment (token-in), or starts at the last `v1` / `v1beta` segment
    (no API path holds two); any other path is left as it is (and answered 404 as before)."""
    if not path.startswith("/s/"):
        return path
    key, slash, rest = path[3:].partition("/")
    if not key or not slash:
        return path
    segments = rest.split("/")
    versions = [i for i, segment in enumerate(segments) if segment in _API_VERSIONS]
    start = len(segments) - 1 if segments[-1] == "generate" else versions[-1] if versions else 0
    return f"/s/{key}/" + "/".join(segments[start:]) if start else path


def match_turn_route(path: str) -> tuple[str, TurnEndpoint, str | None] | None:
    """(endpoint, handler, key in the path) of a turn endpoint, None for any other path."""
    if route := _route(_ANONYMOUS, path):
        return *route, None
    if path.startswith("/s/"):
        key, slash, rest = path[3:].partition("/")
        if key and slash and (route := _route(_PER_SESSION, "/" + rest)):
            return *route, key
    return None


async def serve_turn_route(
    app: FastAPI, route: tuple[str, TurnEndpoint, str | None], scope: Scope, receive: Receive, send: Send
) -> None:
    endpoint, handler, api_key = route
    scope["app"] = app  # what Starlette sets: handlers reach the router state through it
    request = Request(scope, receive)
    started, status = time.perf_counter(), 500
    try:
        try:
            if scope["method"] != "POST":
                raise APIError(
                    405,
                    f"{endpoint} takes POST, not {scope['method']}",
                    code="method_not_allowed",
                    headers={"Allow": "POST"},
                )
            response = await handler(request, api_key)
        except Exception as e:
            response = error_response(as_api_error(e, scope["method"], scope["path"]), endpoint)
        status = response.status_code
        await response(scope, receive, send)
    finally:
        app.state.router.metrics.observe(endpoint, status, time.perf_counter() - started)


class RouterApp(FastAPI):
    """FastAPI, with the turn endpoints dispatched before its middleware stack."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            config = self.state.router.config
            limit = config.max_body_bytes
            if declared_too_large(scope["headers"], limit):  # answered without reading the body
                return await error_response(too_large(limit), scope["path"])(scope, receive, send)
            receive = capped(receive, limit, config.body_timeout)
            if (path := without_caller_segments(scope["path"])) != scope["path"]:
                scope = {**scope, "path": path, "raw_path": path.encode()}
            if (route := match_turn_route(scope["path"])) is not None:
                return await serve_turn_route(self, route, scope, receive, send)
        await super().__call__(scope, receive, send)
