"""Qwen3-Coder: ChatML turns, no reasoning, XML tool calls.

A call is `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n…</function>\\n</tool_call>`;
each value is bare text, typed by the tool's JSON schema (`arguments`). The `renderers` package
has no Qwen3-Coder renderer, so rendering is the model's own Jinja template; it renders each
message on its own, so a turn continues after the sampled reply with the template's rendering of
the new messages (`ChatRenderer`'s tail). The template reads a call's arguments as a mapping
(vLLM parses them before rendering too): the JSON text agents send is parsed first.
"""

from __future__ import annotations

import re
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from slimeish.router.jsontypes import JSONObject
from slimeish.router.renderers.arguments import schema_properties, typed_arguments, with_argument_objects
from slimeish.router.renderers.base import ParsedReply
from slimeish.router.renderers.calls import tagged_calls, tool_call
from slimeish.router.renderers.template import ARGS_MARK, ChatRenderer

CALL, CALL_END, FUNCTION = "<tool_call>", "</tool_call>", "<function="
_FUNCTION = re.compile(r"<function=([^>\n]+)>\n?(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


class Qwen3CoderRenderer(ChatRenderer):
    family = "qwen3-coder"
    call_format = "<tool_call> and <function=…>"

    def __init__(self, model_path: str | Path, tokenizer: PreTrainedTokenizerBase | None = None):
        super().__init__(model_path, tokenizer)
        self._call, self._call_end = self._token_id(CALL), self._token_id(CALL_END)
        self._eos = {self.eos_token_id, self._token_id("<|endoftext|>")}

    @staticmethod
    def recognises(template: str, vocab: dict[str, int]) -> bool:
        """Qwen3-Coder's template: ChatML turns and XML calls, without reasoning (Qwen3.5 has it)."""
        markers = ("<|im_start|>", "<function=", "<parameter=")
        plain = "reasoning_content" not in template
        return plain and all(m in template for m in markers) and CALL in vocab and CALL_END in vocab

    def render_text(
        self, messages: list[JSONObject], tools: list[JSONObject] | None, generation_prompt: bool = True
    ) -> str:
        return super().render_text([with_argument_objects(m) for m in messages], tools, generation_prompt)

    def parse(
        self, forced: str, output_ids: list[int], text: str, finish_type: str, tools: list[JSONObject] | None
    ) -> ParsedReply:
        ids = self._reply_ids(forced, output_ids, self._eos)
        if not tools or self._call not in ids:
            return ParsedReply(self._text(ids))
        return tagged_calls(ids, (self._call, self._call_end), self._text, lambda b: _call(b, tools), finish_type, None)

    def _opening_end(self, rendered: str, name: str | None) -> int:
        if name:
            return rendered.find(f"<parameter={ARGS_MARK}>")
        at = rendered.find(FUNCTION)
        return at + len(FUNCTION) if at >= 0 else -1


def _call(body: str, tools: list[JSONObject]) -> JSONObject:
    """One call's body (`<function=…>…</function>`) as a chat-format tool call."""
    function = _FUNCTION.fullmatch(body)
    if function is None:
        raise ValueError("a tool call must be one <function=NAME>…</function>")
    name, inner = function[1].strip(), function[2]
    raw, at = {}, 0
    for parameter in _PARAMETER.finditer(inner):
        if inner[at : parameter.start()].strip():
            raise ValueError(f"text outside <parameter=…> in the call of {name}")
        raw[parameter[1].strip()] = _strip_one_newline(parameter[2])
        at = parameter.end()
    if inner[at:].strip():
        raise ValueError(f"text outside <parameter=…> in the call of {name}")
    return tool_call(name, typed_arguments(raw, schema_properties(tools, name)))


def _strip_one_newline(value: str) -> str:
    """The template writes each value between newlines: `<parameter=p>\\nVALUE\\n</parameter>`."""
    return value.removeprefix("\n").removesuffix("\n")
