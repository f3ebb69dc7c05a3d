"""The Responses API's request as the router reads it (`POST /v1/responses`): its input items,
each validated on its own so an error names the item (`items`), its tools (functions, freeform
tools, namespaces) and the request's other fields (`ResponsesRequest`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, ValidationError

from slimeish.router.dialects.responses_output import CUSTOM_INPUT
from slimeish.router.errors import from_validation_error
from slimeish.router.jsontypes import JSONObject


class _Item(BaseModel):
    model_config = ConfigDict(extra="allow")  # ids, status, annotations, logprobs: accepted, ignored


class TextPart(_Item):
    type: Literal["input_text", "output_text"]
    text: str


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]


class _CallItem(_Item):
    call_id: str
    name: str
    namespace: str | None = None

    def tool_name(self) -> str:
        """The name the model sampled: a namespace's function under its flattened name."""
        return self.name if self.namespace is None else flat_name(self.namespace, self.name)


class FunctionCallItem(_CallItem):
    type: Literal["function_call"]
    arguments: str


class CustomToolCallItem(_CallItem):
    """A call to a freeform tool: the model saw it as a function of one string (`CUSTOM_INPUT`)."""

    type: Literal["custom_tool_call"]
    input: str


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: str
    output: str | list[TextPart]


class AdditionalToolsItem(_Item):
    """Tools sent as an input item (Codex): served with the request's `tools` (`with_item_tools`)."""

    type: Literal["additional_tools"]
    tools: list[Any]


class ConfigurationUpdateItem(_Item):
    """A change of settings mid-conversation (Codex's reasoning effort): nothing the model reads."""

    type: Literal["configuration_update"]


class ReasoningPart(_Item):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Item):
    type: Literal["reasoning"]
    summary: list[ReasoningPart] = []
    content: list[ReasoningPart] | None = None
    encrypted_content: str | None = None

    def text(self) -> str:
        """The reasoning as sent: its text content, else its summary (what other providers fill)."""
        return "".join(p.text for p in self.content or self.summary)


def item_type(item: Any) -> str:
    return item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "message")


_INPUT_ITEM: TypeAdapter[Any] = TypeAdapter(
    Annotated[
        Annotated[MessageItem, Tag("message")]
        | Annotated[FunctionCallItem, Tag("function_call")]
        | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
        | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
        | Annotated[FunctionCallOutputItem, Tag("custom_tool_call_output")]
        | Annotated[ReasoningItem, Tag("reasoning")]
        | Annotated[AdditionalToolsItem, Tag("additional_tools")]
        | Annotated[ConfigurationUpdateItem, Tag("configuration_update")],
        Discriminator(item_type),
    ]
)


def items(raw: list[Any], start: int = 0) -> list[Any]:
    """The input items from `start`, validated: a 400 names the first bad one (`input.3.content.0.type`)."""
    out = []
    for i, item in enumerate(raw[start:], start):
        try:
            out.append(_INPUT_ITEM.validate_python(item))
        except ValidationError as e:
            raise from_validation_error(e, f"input.{i}") from None
    return out


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomTool(BaseModel):
    """A freeform tool (Codex's `exec`, `apply_patch`): its input is one string, not JSON, so the
    model sees a function of one string argument, described by the tool's grammar if it has one."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["custom"]
    name: str
    description: str | None = None
    format: dict[str, Any] | None = None

    @property
    def parameters(self) -> dict[str, Any]:
        about = "the tool's input, free-form text"
        if self.format and self.format.get("type") == "grammar":
            about += f" matching this {self.format.get('syntax')} grammar: {self.format.get('definition')}"
        return {
            "type": "object",
            "properties": {CUSTOM_INPUT: {"type": "string", "description": about}},
            "required": [CUSTOM_INPUT],
        }


NamespacedTool = Annotated[FunctionTool | CustomTool, Field(discriminator="type")]


class NamespaceTool(BaseModel):
    """A group of tools (Codex's multi-agent tools): served as its tools, each under `flat_name`,
    since chat templates know no namespaces."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[NamespacedTool]


def flat_name(namespace: str, name: str) -> str:
    # `__` joins as in Codex's own MCP tool names (`mcp__server__tool`), and passes chat's name rule.
    return f"{namespace}__{name}"


# Tools that run on OpenAI's side; Codex offers `web_search` by default.
HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "file_search",
        "code_interpreter",
        "computer_use_preview",
        "image_generation",
        "mcp",
    }
)


class NamedFunction(BaseModel):
    type: Literal["function"]
    name: str


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # include, reasoning, text, truncation, user: accepted, ignored
    model: str | None = None
    input: str | list[Any]  # items are checked one by one (`items`), so an error names the item
    instructions: str | None = None
    tools: list[Annotated[FunctionTool | CustomTool | NamespaceTool, Field(discriminator="type")]] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    metadata: dict[str, str] | None = None
    store: bool = True
    previous_response_id: str | None = None
    stream: bool = False


def with_item_tools(body: JSONObject) -> JSONObject:
    """The body with the tools of its `additional_tools` input items (Codex sends its tools there)
    after its own `tools`: the model sees one tool list, whichever way they came."""
    raw = body.get("input")
    extra = [
        t
        for item in (raw if isinstance(raw, list) else [])
        if isinstance(item, dict) and item.get("type") == "additional_tools" and isinstance(item.get("tools"), list)
        for t in item["tools"]
    ]
    return {**body, "tools": [*(body.get("tools") or []), *extra]} if extra else body
