"""GLM-4.5: reasoning in `<think>…</think>`, calls as `<arg_key>`/`<arg_value>` pairs.

A reply (after the generation prompt `<|assistant|>`) is `\\n<think>REASONING</think>\\nCONTENT`
and then calls, each `<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n…</tool_call>`;
the model ends its turn with the next role's marker (`<|observation|>` after calls, `<|user|>`)
or `<|endoftext|>`. A value is written bare when it is a string and as JSON otherwise, so the
tool's schema types it (`arguments`). Rendering and bridging come from the `renderers`
package's GLM-4.5 renderer (`BridgedRenderer`); parsing is slimeish's own, on token ids, with
Qwen3's rules: reasoning only from a leading closed `<think>`, calls only after it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import renderers
from transformers import PreTrainedTokenizerBase

from slimeish.router.jsontypes import JSONObject
from slimeish.router.renderers.arguments import schema_properties, typed_arguments
from slimeish.router.renderers.base import ParsedReply
from slimeish.router.renderers.bridged import BridgedRenderer
from slimeish.router.renderers.calls import tagged_calls, tool_call

THINK, THINK_END, CALL, CALL_END, ARG_KEY = "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>"
_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class GLM45Renderer(BridgedRenderer):
    family = "glm-4.5"
    format_name = "GLM-4.5"
    argument_objects = True
    reply_prefix = "\n<think></think>\n"  # a reply the template renders with no reasoning
    reasoning_markers = ("\n" + THINK, THINK_END)  # the reply's first token is the newline
    call_format = "<tool_call>NAME and <arg_key>/<arg_value> pairs"

    def __init__(self, model_path: str | Path, tokenizer: PreTrainedTokenizerBase | None = None):
        super().__init__(model_path, tokenizer)
        self._think, self._think_end, self._call, self._call_end = map(
            self._token_id, (THINK, THINK_END, CALL, CALL_END)
        )

    def library(self) -> Any:
        # "all": bridge across user queries too (the template would re-render without old reasoning).
        return renderers.GLM45Renderer(self.tokenizer, renderers.GLM45RendererConfig(thinking_retention="all"))

    @staticmethod
    def recognises(template: str, vocab: dict[str, int]) -> bool:
        """GLM-4.5's template: `[gMASK]<sop>`, role markers, one argument tag a line (GLM-4.7 joins them)."""
        markers = ("[gMASK]<sop>", "<|observation|>", "</arg_key>\n<arg_value>")
        return all(m in template for m in markers) and all(t in vocab for t in (THINK, THINK_END, CALL, ARG_KEY))

    def parse(
        self, forced: str, output_ids: list[int], text: str, finish_type: str, tools: list[JSONObject] | None
    ) -> ParsedReply:
        ids = self._reply_ids(forced, output_ids, self._stops)
        reasoning, body = None, ids
        if self._think in ids and self._think_end in ids:
            start, end = ids.index(self._think), ids.index(self._think_end)
            if start < end and self._text(ids[:start]) == "\n":
                reasoning, body = self._text(ids[start + 1 : end]).strip("\n"), ids[end + 1 :]
        thought = reasoning or None  # the template's `<think></think>` of a reply without reasoning is none
        if not tools or self._call not in body:
            content = self._text(body)
            return ParsedReply(content.lstrip("\n") if reasoning is not None else content, thought)
        parse_one = lambda b: _call(b, tools)  # noqa: E731
        return tagged_calls(body, (self._call, self._call_end), self._text, parse_one, finish_type, thought)

    def _opening_end(self, rendered: str, name: str | None) -> int:
        if name:
            return rendered.find(ARG_KEY)
        at = rendered.find(CALL)
        return at + len(CALL) if at >= 0 else -1


def _call(body: str, tools: list[JSONObject]) -> JSONObject:
    """One call's body (`NAME` then `<arg_key>`/`<arg_value>` pairs) as a chat-format tool call."""
    head, opening, rest = body.partition(ARG_KEY)
    name, pairs = head.strip(), opening + rest
    if not name or any(c.isspace() for c in name) or "<" in name:
        raise ValueError("a tool call must open with the function's name")
    raw, at = {}, 0
    for pair in _PAIR.finditer(pairs):
        if pairs[at : pair.start()].strip():
            raise ValueError(f"text outside <arg_key>/<arg_value> in the call of {name}")
        raw[pair[1].strip()] = pair[2]
        at = pair.end()
    if pairs[at:].strip():
        raise ValueError(f"text outside <arg_key>/<arg_value> in the call of {name}")
    return tool_call(name, typed_arguments(raw, schema_properties(tools, name)))
