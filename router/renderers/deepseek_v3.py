"""DeepSeek-V3 (V3-0324's chat template): no reasoning, calls in a section of marker tokens.

A reply (after `<｜Assistant｜>`) is its content, then optionally its calls: `<｜tool▁calls▁begin｜>`,
each `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGUMENTS\\n```<｜tool▁call▁end｜>`
with `\\n` between calls, `<｜tool▁calls▁end｜>`, then `<｜end▁of▁sentence｜>`. Calls are parsed on
the ids; a call cut by the length limit is `truncated`, one that does not read `malformed`, and
either way the reply goes back unchanged as content.

Rendering is the model's own Jinja template (`ChatRenderer`): it writes each message on its own
(prefix-stable; no reasoning to drop), so a turn's tail is found by subtraction, and the official
template's quirks hold. The `renderers` package's DeepSeek-V3 renderer is not used: it writes
parallel calls and consecutive tool results without the `\\n` the template puts between them, so
its rendering and its bridge differ from the template on those turns. Like DeepSeek's own
template, the prompt does not list the request's tools (a deployment that wants them there gives
the model a template that does; `--renderer template` then stays exact).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from slimeish.router.jsontypes import JSONObject
from slimeish.router.renderers.base import MALFORMED, TRUNCATED, CallMarker, ParsedReply
from slimeish.router.renderers.calls import tagged_calls, tool_call
from slimeish.router.renderers.template import ChatRenderer

CALLS, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_BODY = re.compile(r"(\w+)" + SEP + r"([^\s<]+)\n```json\n(.*)\n```", re.DOTALL)


class DeepSeekV3Renderer(ChatRenderer):
    family = "deepseek-v3"
    call_format = f"{CALLS}{CALL}function{SEP}NAME and a ```json block"
    call_opening = CALLS
    call_marker = CallMarker(CALLS)

    def __init__(self, model_path: str | Path, tokenizer: PreTrainedTokenizerBase | None = None):
        super().__init__(model_path, tokenizer)
        markers = map(self._token_id, (CALLS, CALLS_END, CALL, CALL_END))
        self._calls, self._calls_end, self._call, self._call_end = markers

    @staticmethod
    def recognises(template: str, vocab: dict[str, int]) -> bool:
        """DeepSeek-V3's template: `<｜User｜>`/`<｜Assistant｜>` turns, a ```json block per call,
        no reasoning (R1's template, which strips `</think>`, is another format)."""
        markers = ("<｜User｜>", "<｜Assistant｜>", CALLS, "```json")
        return (
            "</think>" not in template
            and all(m in template for m in markers)
            and all(t in vocab for t in (CALLS, CALLS_END, CALL, CALL_END, SEP))
        )

    def render_text(
        self, messages: list[JSONObject], tools: list[JSONObject] | None, generation_prompt: bool = True
    ) -> str:
        # The template concatenates a call's arguments as text: an object is written as JSON.
        return super().render_text([_with_argument_text(m) for m in messages], tools, generation_prompt)

    def parse(
        self, forced: str, output_ids: list[int], text: str, finish_type: str, tools: list[JSONObject] | None
    ) -> ParsedReply:
        ids = self._reply_ids(forced, output_ids, (self.eos_token_id,))
        if not tools or self._calls not in ids:
            return ParsedReply(self._text(ids))
        at = ids.index(self._calls)  # calls count only inside the section, as a stream holds them back
        section = [t for t in ids[at + 1 :] if t != self._calls_end]
        parsed = tagged_calls(section, (self._call, self._call_end), self._text, _call, finish_type, None)
        if not parsed.tool_calls and not parsed.failure:  # a section opened, no call in it
            cut = finish_type == "length" and self._calls_end not in ids
            parsed = ParsedReply(None, failure=TRUNCATED if cut else MALFORMED, error="a call section with no call")
        if parsed.failure:  # the reply goes back as it was sampled, section markers included
            return ParsedReply(self._text(ids), failure=parsed.failure, error=parsed.error)
        content = "\n".join(t for t in (self._text(ids[:at]).strip(), parsed.content) if t)
        return ParsedReply(content or None, tool_calls=parsed.tool_calls)

    def _opening_end(self, rendered: str, name: str | None) -> int:
        if name:
            return super()._opening_end(rendered, name)
        at = rendered.find(SEP)
        return at + len(SEP) if at >= 0 else -1


def _call(body: str) -> JSONObject:
    """One call's body (`function<｜tool▁sep｜>NAME`, then its arguments in a ```json block)."""
    match = _BODY.fullmatch(body)
    if match is None:
        raise ValueError(f"a call must be function{SEP}NAME then its arguments in a ```json block")
    arguments = json.loads(match[3])
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments of {match[2]} are not a JSON object")
    return tool_call(match[2], json.dumps(arguments, ensure_ascii=False))


def _with_argument_text(message: JSONObject) -> JSONObject:
    calls = message.get("tool_calls")
    if not calls:
        return message
    return {**message, "tool_calls": [_argument_text(c) for c in calls]}


def _argument_text(call: JSONObject) -> JSONObject:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        return call
    return {**call, "function": {**function, "arguments": json.dumps(arguments or {}, ensure_ascii=False)}}
