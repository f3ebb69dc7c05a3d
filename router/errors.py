"""Every error the router answers, in the shape of the API it was asked in, and the one table from
exceptions to it.

Domain code raises its own exceptions (the engine pool's, the store's `StoreUnavailable`, the
buffer's refusals); the HTTP layer raises `APIError`. `as_api_error` turns any exception into an
`APIError` with its status; an unexpected one is a 500 whose details stay in the log. The body is
OpenAI's `{"error": {"message", "type", "param", "code"}}`, except under `/v1/messages`, where it
is Anthropic's `{"type": "error", "error": {"type", "message"}}`, and on Gemini's paths
(`gemini_path`), where it is Google's `{"error": {"code", "message", "status"}}`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from slimeish.buffer import BufferInputError, ConflictError, SessionFinishedError
from slimeish.common.redact import redact
from slimeish.router.engine_http import EngineError, EngineFailedMidStream, EngineRejected, GenerationAborted
from slimeish.router.engine_pool import NoEngineError
from slimeish.router.storage import StoreUnavailable

log = logging.getLogger(__name__)


class APIError(Exception):
    """An error the client sees as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def google_body(self) -> dict[str, Any]:
        status = _GOOGLE_STATUS.get(self.status, "INTERNAL" if self.status >= 500 else "INVALID_ARGUMENT")
        return {"error": {"code": self.status, "message": self.message, "status": status}}


# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


# Google's canonical status names by HTTP status (google.rpc.Code).
_GOOGLE_STATUS = {
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _api_path(path: str) -> str:
    """`path` without a session's `/s/<key>`."""
    return "/" + path[3:].partition("/")[2] if path.startswith("/s/") else path


def anthropic_path(path: str) -> bool:
    """Whether `path` (with or without a session's `/s/<key>`) is under Anthropic's `/v1/messages`."""
    path = _api_path(path)
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def gemini_path(path: str) -> bool:
    """Whether `path` (with or without a session's `/s/<key>`) is Gemini's: under `/v1beta/`, or a
    method on a model under `/v1/` (`/v1/models/{model}:{method}`, google-genai's default version)."""
    path = _api_path(path)
    return path.startswith("/v1beta/") or (path.startswith("/v1/models/") and ":" in path)


def _server_error(status: int, code: str) -> Callable[[Exception], APIError]:
    return lambda e: APIError(status, str(e), type="server_error", code=code)


# What the client is told about each known exception; a subclass's own entry wins over its base's.
_BY_TYPE: dict[type[Exception], Callable[[Any], APIError]] = {
    SessionFinishedError: lambda e: APIError(409, str(e), code="session_finished"),
    ConflictError: lambda e: APIError(409, str(e), code="conflict"),
    BufferInputError: lambda e: APIError(400, str(e), code="buffer_rejected"),
    StoreUnavailable: _server_error(503, "store_unavailable"),
    NoEngineError: _server_error(503, "no_healthy_engine"),
    EngineError: lambda e: APIError(e.status, str(e), type="server_error", code="engine_error"),
    EngineRejected: lambda e: APIError(400, str(e), code="engine_rejected"),
    EngineFailedMidStream: _server_error(502, "engine_failed"),
    GenerationAborted: _server_error(503, "generation_aborted"),
    RequestValidationError: lambda e: APIError(400, str(e.errors()[0].get("msg", e))),
}

# Shown with every unknown path, so that a misconfigured client learns where to point.
_SERVED = (
    "the router serves POST /v1/chat/completions, POST /v1/responses, POST /v1/messages (Anthropic), "
    "POST /v1/messages/count_tokens, POST /v1beta/models/<model>:generateContent, :streamGenerateContent and "
    ":countTokens (Gemini; /v1/models/... too), POST /v1/completions and GET /v1/models (also under a "
    "session's base_url /s/<api_key>/v1), POST /s/<api_key>/generate (token-in), /sessions and /admin/* "
    "(operators), GET /health and GET /metrics; see docs/router.md"
)


def as_api_error(e: Exception, method: str, path: str) -> APIError:
    """What the client is told about any exception a request raised; an unexpected one is a 500
    whose details stay in the log, under an id the message gives. Neither repeats the session key
    of a `/s/<key>/` path: agents log their errors too."""
    path = redact(path)
    if isinstance(e, HTTPException):
        return _from_http_exception(e, method, path)
    if (known := known_error(e)) is not None:
        return known
    error_id = secrets.token_hex(6)
    log.error("internal error %s on %s %s", error_id, method, path, exc_info=e)
    message = f"internal error (id {error_id}); the router's log has the details"
    return APIError(500, message, type="server_error", code="internal_error")


def known_error(e: Exception) -> APIError | None:
    """What the client is told about an exception the router expects; None for any other (a bug)."""
    if isinstance(e, APIError):
        return e
    for cls in type(e).__mro__:
        if (to_api_error := _BY_TYPE.get(cls)) is not None:
            return to_api_error(e)
    return None


def _from_http_exception(e: HTTPException, method: str, path: str) -> APIError:
    """Starlette's own refusals (no such route, wrong method) in the API's shape."""
    if e.status_code == 404:
        return APIError(404, f"no route {method} {path}; {_SERVED}", code="not_found")
    if e.status_code == 405:
        allowed = (e.headers or {}).get("Allow", "another method")
        return APIError(405, f"{path} takes {allowed}, not {method}", code="method_not_allowed", headers=e.headers)
    return APIError(e.status_code, str(e.detail), headers=e.headers)


def from_validation_error(e: ValidationError, prefix: str = "") -> APIError:
    """A 400 naming the first invalid field (dotted, under `prefix`)."""
    err = e.errors()[0]
    loc = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
    return APIError(400, f"{loc}: {err['msg']}" if loc else err["msg"], param=loc or None)


def error_response(e: APIError, path: str = "") -> Response:
    """The error in the shape of the API `path` belongs to, with its status."""
    body = e.anthropic_body() if anthropic_path(path) else e.google_body() if gemini_path(path) else e.body()
    return Response(orjson.dumps(body), e.status, headers=e.headers, media_type="application/json")


def install_error_handlers(app: FastAPI) -> None:
    """Answer every exception FastAPI's request path raises with `as_api_error`'s body."""

    async def api_error(request: Request, e: Exception) -> Response:
        return error_response(as_api_error(e, request.method, request.url.path), request.url.path)

    # Starlette answers an unexpected `Exception` in its outermost middleware, then re-raises it;
    # the known ones are answered inside, like any handled error.
    for error in (APIError, HTTPException, *_BY_TYPE, Exception):
        app.add_exception_handler(error, api_error)
