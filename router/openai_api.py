"""OpenAI request schemas (validated with pydantic) and OpenAI-shaped errors.

Chat messages are validated one by one (`validate_messages`) instead of as a field of the
request model, so a turn that extends the previous one validates only its new messages: the
earlier ones were validated when they were new and are compared to the stored copy verbatim.
"""

from __future__ import annotations

import logging
import re
import secrets
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from slimeish.buffer.errors import BufferInputError, ConflictError, SessionFinishedError
from slimeish.router.engine_pool import EngineError, EngineRejected, NoEngineError

log = logging.getLogger(__name__)


class APIError(Exception):
    """An error the client sees as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param=None, code=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def from_buffer_error(e: BufferInputError) -> APIError:
    """The buffer refused a write as inconsistent: 409 for a conflict with what it holds, else 400."""
    if isinstance(e, SessionFinishedError):
        return APIError(409, str(e), code="session_finished")
    if isinstance(e, ConflictError):
        return APIError(409, str(e), code="conflict")
    return APIError(400, str(e), code="buffer_rejected")


def as_api_error(e: Exception, method: str, path: str) -> APIError:
    """What the client is told about any exception a request raised; an unexpected one is a 500
    whose details stay in the log, under an id the message gives."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, BufferInputError):
        return from_buffer_error(e)
    if isinstance(e, NoEngineError):
        return APIError(503, str(e), type="server_error", code="no_healthy_engine")
    if isinstance(e, EngineError):
        return APIError(e.status, str(e), type="server_error", code="engine_error")
    if isinstance(e, EngineRejected):
        return APIError(400, str(e), code="engine_rejected")
    error_id = secrets.token_hex(6)
    log.error("internal error %s on %s %s", error_id, method, path, exc_info=e)
    message = f"internal error (id {error_id}); the router's log has the details"
    return APIError(500, message, type="server_error", code="internal_error")


def store_unavailable(e: Exception, what: str) -> APIError:
    """The buffer could not be written (e.g. Redis unreachable): nothing changed, the client may retry."""
    return APIError(
        503, f"{what} could not be stored ({type(e).__name__}); nothing changed: retry", type="server_error",
        code="store_unavailable",
    )  # fmt: skip


def from_validation_error(e: ValidationError, prefix: str = "") -> APIError:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
    return APIError(400, f"{loc}: {err['msg']}" if loc else err["msg"], param=loc or None)


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")  # SDKs send fields we ignore (e.g. `refusal`, `annotations`)


class TextPart(_Lenient):
    type: Literal["text"]
    text: str


Content = str | list[TextPart]


class FunctionCall(_Lenient):
    name: str
    arguments: str | dict[str, Any]


class ToolCall(_Lenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(_Lenient):
    role: Literal["system", "developer"]
    content: Content


class UserMessage(_Lenient):
    role: Literal["user"]
    content: Content


class AssistantMessage(_Lenient):
    role: Literal["assistant"]
    content: Content | None = None
    tool_calls: list[ToolCall] | None = None


class ToolMessage(_Lenient):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]
_MESSAGE = TypeAdapter(Message)


def validate_messages(messages: list[Any], start: int = 0) -> None:
    """Raise APIError(400) naming the first invalid message at index >= `start`."""
    for i in range(start, len(messages)):
        try:
            _MESSAGE.validate_python(messages[i])
        except ValidationError as e:
            raise from_validation_error(e, f"messages.{i}") from None


_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class FunctionDef(BaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    strict: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> FunctionDef:
        if not _FUNCTION_NAME.match(self.name):
            raise ValueError(f"function name {self.name!r} must match {_FUNCTION_NAME.pattern}")
        if self.parameters and self.parameters.get("type", "object") != "object":
            raise ValueError("function parameters must be a JSON Schema of type 'object'")
        return self


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: dict[str, str]


def _top_k(k: int) -> int:
    if k != -1 and k < 1:
        raise ValueError("top_k must be -1 (off) or >= 1")
    return k


TopK = Annotated[int, AfterValidator(_top_k)]  # SGLang's extension; OpenAI has no top_k


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    n: int = Field(1, ge=1, le=16)
    stop: str | list[str] | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: TopK | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatRequest(SamplingFields):
    # Checked message by message (validate_messages): only the new ones on a turn that extends the last.
    messages: list[Any] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @model_validator(mode="after")
    def _check(self) -> ChatRequest:
        names = {t.function.name for t in self.tools or []}
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.get("name") not in names:
            raise ValueError(f"tool_choice names function {self.tool_choice.function.get('name')!r}, not in tools")
        if self.tool_choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs at least one tool")
        return self

    def new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: str | list[int] = Field(min_length=1)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported")
        return self
