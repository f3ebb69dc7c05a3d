"""Llama 3.x (3.1/3.2 Instruct): no reasoning, one JSON call per reply.

A call is the whole reply: `{"name": NAME, "parameters": {…}}` (3.2's template writes it so; models
also write `"arguments"`), possibly after `<|python_tag|>`, ended by `<|eot_id|>` or `<|eom_id|>`
(the model expects a tool result). Several calls are read when the model writes them one after
another, separated by `;` (as vLLM's `llama3_json` parser reads them); the template itself renders
one call per message. A reply that opens with `{` is a call: if it does not read as one it goes
back unchanged as content, counted `malformed` (`truncated` when the length limit cut it).
Rendering and bridging come from the `renderers` package's Llama 3 renderer (`BridgedRenderer`),
whose date line is the template's own fallback (`26 Jul 2024`), so a prompt does not change with
the day it is rendered on.
"""

from __future__ import annotations

import json
from typing import Any

import renderers

from slimeish.router.jsontypes import JSONObject
from slimeish.router.renderers.base import MALFORMED, TRUNCATED, CallMarker, ParsedReply
from slimeish.router.renderers.bridged import BridgedRenderer
from slimeish.router.renderers.calls import tool_call

CALL = '{"name": "'


class Llama3Renderer(BridgedRenderer):
    family = "llama3"
    format_name = "Llama 3"
    argument_objects = True
    call_format = 'a JSON object {"name": …, "parameters": …}'
    call_opening = CALL
    call_marker = CallMarker("{", at_start=True)

    def library(self) -> Any:
        return renderers.Llama3Renderer(self.tokenizer)

    @staticmethod
    def recognises(template: str, vocab: dict[str, int]) -> bool:
        """Llama 3.x's template: header-id turns, `ipython` tool results, JSON calls with `parameters`."""
        markers = ("<|start_header_id|>", "<|eot_id|>", "Environment: ipython", '"parameters": ')
        return all(m in template for m in markers) and all(t in vocab for t in ("<|python_tag|>", "<|eom_id|>"))

    def parse(
        self, forced: str, output_ids: list[int], text: str, finish_type: str, tools: list[JSONObject] | None
    ) -> ParsedReply:
        ids = self._reply_ids(forced, output_ids, self._stops)
        reply = self.decode(ids)  # `<|python_tag|>` is a special token: not part of the text
        if not tools or not reply.lstrip().startswith("{"):
            return ParsedReply(reply)
        try:
            return ParsedReply(None, tool_calls=_calls(reply.strip()))
        except ValueError as e:
            return ParsedReply(reply, failure=TRUNCATED if finish_type == "length" else MALFORMED, error=str(e))

    def _opening_end(self, rendered: str, name: str | None) -> int:
        return super()._opening_end(rendered, name) if name else len(CALL)


def _calls(text: str) -> list[JSONObject]:
    """The calls in `text`: JSON objects with a `name` and `parameters` (or `arguments`), `;` between."""
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(text):
        call, at = decoder.raw_decode(text, at)
        arguments = call.get("parameters", call.get("arguments")) if isinstance(call, dict) else None
        if not isinstance(arguments, dict) or not isinstance(call.get("name"), str):
            raise ValueError('a call must be {"name": NAME, "parameters": {…}}')
        calls.append(tool_call(call["name"], json.dumps(arguments, ensure_ascii=False)))
        rest = text[at:].lstrip()
        if rest and not rest.startswith(";"):
            raise ValueError("text after a call")
        at = len(text) - len(rest.removeprefix(";").lstrip())
    return calls
