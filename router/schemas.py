"""OpenAI request schemas, validated with pydantic (a 400 in OpenAI's shape when a request does not fit).

Chat messages are validated one by one (`validate_messages`) instead of as a field of the
request model, so a turn that extends the previous one validates only its new messages: the
earlier ones were validated when they were new and are compared to the stored copy verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from slimeish.router.errors import APIError, from_validation_error


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


ToolChoice = str | NamedToolChoice | None  # "auto" | "none" | "required" | one named function


def _top_k(k: int) -> int:
    if k != -1 and k < 1:
        raise ValueError("top_k must be -1 (off) or >= 1")
    return k


TopK = Annotated[int, AfterValidator(_top_k)]  # SGLang's extension; OpenAI has no top_k


class StreamOptions(BaseModel):
    include_usage: bool = False


MAX_N = 16  # choices one request may ask for, on every path: each is a sequence generated and recorded


def check_n(sampling_params: Mapping[str, Any]) -> None:
    """A 400 unless SGLang's `sampling_params.n` (default 1) is an int in 1..MAX_N."""
    n = sampling_params.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise APIError(
            400, f"sampling_params.n must be an integer from 1 to {MAX_N}, got {n!r}", param="sampling_params.n"
        )


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
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
