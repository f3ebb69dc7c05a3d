"""Tools, the tool choice and text content as every dialect hands them to capture, in one place:
each API names them its own way (`input_schema` / `parameters`, `any` / `required`, blocks /
parts), but what the conversation gets, and what is refused, is the same."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from pydantic import ValidationError

from slimeish.router.errors import APIError, from_validation_error
from slimeish.router.schemas import NamedToolChoice, Tool, ToolChoice

JSONSchema = dict[str, Any]


class HasText(Protocol):
    @property
    def text(self) -> str: ...


def joined_text(content: str | Sequence[HasText]) -> str:
    """A content string, or its text blocks / parts joined."""
    return content if isinstance(content, str) else "".join(p.text for p in content)


def served_tools(
    body: dict[str, Any], served: tuple[str | None, ...], define: str, hosted: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The body with only the tools the agent runs itself (`served` types), which can be sampled
    here. `hosted` types run on the provider's side (web search): nothing here can run them, and an
    agent that offers them by default (Codex) expects no call, so they are left out of the prompt.
    Any other type is refused by name."""
    tools = body.get("tools") or []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in served and kind not in hosted:
            raise APIError(400, f"tools.{i}: hosted tool type {kind!r} is not served; define {define}")
    if not any(isinstance(t, dict) and t.get("type") in hosted for t in tools):
        return body
    return {**body, "tools": [t for t in tools if t.get("type") not in hosted]}


def chat_tools(tools: Iterable[tuple[str, str | None, JSONSchema | None]]) -> list[dict[str, Any]] | None:
    """The API's function tools, each (name, description, JSON schema), as chat `tools`,
    validated as chat's are (errors name `tools.<i>`)."""
    out = []
    for i, (name, description, parameters) in enumerate(tools):
        function = {"name": name, "description": description, "parameters": parameters}
        tool = {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}
        try:
            Tool.model_validate(tool)
        except ValidationError as e:
            raise from_validation_error(e, f"tools.{i}") from None
        out.append(tool)
    return out or None


def tool_choice(kind: str | None, name: str | None, names: Sequence[str], said: str | None = None) -> ToolChoice:
    """The conversation's tool choice: `kind` "auto" | "none" | "required" (None: the API's
    default), or `name` for one function, checked against the request's tool `names`. `said` is
    how the API spells `kind`, for the error."""
    if name is not None:
        if name not in names:
            raise APIError(400, f"tool_choice names tool {name!r}, which is not in tools", param="tool_choice")
        return NamedToolChoice(type="function", function={"name": name})
    if kind == "required" and not names:
        raise APIError(400, f"tool_choice {said or kind!r} needs at least one tool", param="tool_choice")
    return kind
