"""Arguments written as text (XML calls: Qwen3-Coder, GLM-4.5) typed by the tool's JSON schema.

These formats write every argument value as bare text, so `5` may be the integer 5 or the string
"5": the tool's schema decides. The rules follow the parsers that ship with these models
(vLLM's `qwen3_coder` and `glm45` tool parsers): a string parameter keeps its text as written, a
number/integer/boolean is read as one, an object or array as JSON; a value that is not what its
schema says, or a parameter the schema does not name, is read as JSON if it is JSON and is
otherwise kept as text, so the agent sees what the model wrote.
"""

from __future__ import annotations

import json
from typing import Any

from slimeish.router.jsontypes import JSONObject
from slimeish.router.renderers.base import TemplateError


def schema_properties(tools: list[JSONObject] | None, name: str) -> dict[str, JSONObject]:
    """The JSON-schema properties of the chat-format tool `name` ({} when it is not offered)."""
    for tool in tools or []:
        function = tool.get("function", tool)
        if function.get("name") == name:
            properties = (function.get("parameters") or {}).get("properties")
            return properties if isinstance(properties, dict) else {}
    return {}


def typed_arguments(raw: dict[str, str], properties: dict[str, JSONObject]) -> str:
    """The JSON object of `raw` (parameter name -> its text), each value typed by its schema."""
    return json.dumps({k: typed_value(v, properties.get(k)) for k, v in raw.items()}, ensure_ascii=False)


def typed_value(text: str, schema: JSONObject | None) -> Any:
    kind = _kind(schema)
    if kind == "string":
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _kind(schema: JSONObject | None) -> str | None:
    """The schema's one non-null type (`["string", "null"]` is a string), None when it has none."""
    kind = (schema or {}).get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    return kind if isinstance(kind, str) else None


def with_argument_objects(message: JSONObject) -> JSONObject:
    """`message` with its calls' JSON-text arguments (as agents send them) parsed into the objects
    that templates iterating over a call's arguments (XML formats) read; TemplateError if one is not an object."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    return {**message, "tool_calls": [_parsed_arguments(c) for c in calls]}


def _parsed_arguments(call: JSONObject) -> JSONObject:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError as e:
        raise TemplateError(f"tool call {function.get('name')!r}: arguments are not a JSON object: {e}") from e
    if not isinstance(parsed, dict):
        raise TemplateError(f"tool call {function.get('name')!r}: arguments are not a JSON object")
    return {**call, "function": {**function, "arguments": parsed}}
