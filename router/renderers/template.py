"""Render chat messages to token ids with the model's own chat template.

Two entry points: `full_ids` renders a whole conversation (a segment's first turn), and
`tail_ids` renders only what follows an assistant message the model produced, so a turn that
extends the previous one costs O(new tokens), not O(history). The tail is found by rendering
`[anchor, *tail]` and removing the rendering of `[anchor]` — valid whenever the template renders
each message independently of the ones before it (ChatML/Hermes/Qwen do); tests check it against
a full render.

`tool_call_opening` gives the start of a tool call as the template renders it, which the router
appends to the prompt to enforce `tool_choice` without constrained decoding.
"""

from __future__ import annotations

from collections.abc import Collection
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from slimeish.router.history import FOREIGN_REASONING
from slimeish.router.jsontypes import JSONObject
from slimeish.router.renderers.base import MALFORMED, TRUNCATED, CallMarker, ParsedReply, TemplateError
from slimeish.router.tool_parser import TOOL_CALL_OPEN, parse_tool_calls

ARGS_MARK = "slimeish_arguments"  # a key no real call uses: marks where a rendered call's arguments begin


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """The form chat templates expect: text parts joined into one string, `None` content as ''."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
    role = "system" if message.get("role") == "developer" else message.get("role")
    out = {**message, "role": role, "content": content or ""}
    out.pop(FOREIGN_REASONING, None)  # the router's own mark, no field of the chat format
    return out


class ChatRenderer:
    """The model's own Jinja template, tails found by subtraction, Hermes-style tool calls: the
    `template` renderer, for any model whose template renders each message independently."""

    family = "template"
    reply_prefix = ""  # what the template writes at the start of a reply before a tool call
    reasoning_markers: tuple[str, str] | None = None
    # The tail is the template's own rendering after the sampled reply: both choices agree unless
    # the agent's echo or the tokenization differs from what was sampled.
    next_turn_prompt = "sampled"
    call_format = "<tool_call> and a JSON object"  # how a reply's tool call opens, for error messages
    call_opening = TOOL_CALL_OPEN  # how the template's rendering of a call starts
    call_marker = CallMarker(TOOL_CALL_OPEN)  # where a sampled call starts (streams hold content back from it)

    def __init__(self, model_path: str | Path, tokenizer: PreTrainedTokenizerBase | None = None):
        """`tokenizer`: the model's, already loaded (`load_renderer` loads it once); None loads it."""
        self.tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(str(model_path))
        if self.tokenizer.chat_template is None:
            raise ValueError(f"{model_path}: the tokenizer has no chat template")
        self.eos_token: str = self.tokenizer.eos_token
        self.eos_token_id: int = self.tokenizer.eos_token_id
        self._model_path = str(model_path)
        self._openings: dict[str | None, tuple[list[int], str]] = {}

    @cached_property
    def context_length(self) -> int:
        config = AutoConfig.from_pretrained(self._model_path)
        return int(getattr(config, "max_position_embeddings", None) or self.tokenizer.model_max_length)

    def encode(self, text: str) -> list[int]:
        if self.tokenizer.is_fast:  # the Rust tokenizer directly: same ids, half the per-call cost
            if len(text) > 100_000:  # encode_batch releases the GIL: the event loop runs on meanwhile
                ids: list[int] = self.tokenizer.backend_tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
                return ids
            ids = self.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
            return ids
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        # One sequence of ids decodes to one string (transformers' return type covers batches too).
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id], skip_special_tokens=False)

    def _token_id(self, token: str) -> int:
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        assert isinstance(token_id, int)  # one token in, one id out
        return token_id

    def _reply_ids(self, forced: str, output_ids: list[int], stops: Collection[int]) -> list[int]:
        """A reply's ids as the families' parsers read them: the forced opening's, then the sampled
        ones, without the stop tokens that ended it."""
        ids = (self.encode(forced) if forced else []) + output_ids
        while ids and ids[-1] in stops:
            ids = ids[:-1]
        return ids

    def _text(self, ids: list[int]) -> str:
        """The text of `ids`, markup included (the families' parsers read it)."""
        return self.decode(ids, skip_special_tokens=False)

    def render_text(
        self, messages: list[JSONObject], tools: list[JSONObject] | None, generation_prompt: bool = True
    ) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                [template_message(m) for m in messages],
                tools=tools or None,  # type: ignore[arg-type]  # transformers' list[JSONObject | Callable] is invariant
                tokenize=False,
                add_generation_prompt=generation_prompt,
            )
        except Exception as e:  # jinja raises many types; all mean "cannot render this input"
            raise TemplateError(f"chat template failed on these messages: {e}") from e
        return cast(str, text)  # tokenize=False: the rendered text

    def full_ids(self, messages: list[JSONObject], tools: list[JSONObject] | None) -> list[int]:
        return self.template_ids(messages, tools)

    def template_ids(self, messages: list[JSONObject], tools: list[JSONObject] | None) -> list[int]:
        return self.encode(self.render_text(messages, tools))

    def tail_ids(self, anchor: JSONObject, ended_with_eos: bool, tail: list[JSONObject]) -> list[int]:
        """Tokens that follow the sampled tokens of `anchor` (the model's last reply) up to the
        next generation prompt: the template's closing of `anchor` that was not sampled (`\\n`
        after a sampled eos, or eos + `\\n` when generation stopped otherwise), then `tail`."""
        base = self.render_text([anchor], None, generation_prompt=False)
        full = self.render_text([anchor, *tail], None, generation_prompt=True)
        cut = base.rfind(self.eos_token)
        if not full.startswith(base) or cut < 0:
            raise TemplateError("chat template is not prefix-stable at an assistant turn")
        closing = base[cut + len(self.eos_token) :] if ended_with_eos else base[cut:]
        return self.encode(closing + full[len(base) :])

    def continuation(
        self,
        tokens: list[int],
        output_len: int,
        anchor: JSONObject,
        tail: list[JSONObject],
        tools: list[JSONObject] | None,
    ) -> list[int]:
        ended_with_eos = output_len > 0 and tokens[-1] == self.eos_token_id
        return self.tail_ids(anchor, ended_with_eos, tail)

    def parse(
        self, forced: str, output_ids: list[int], text: str, finish_type: str, tools: list[JSONObject] | None
    ) -> ParsedReply:
        """Hermes calls, parsed from the text (the template's markup is plain text to it)."""
        text = forced + text
        if not tools:
            return ParsedReply(content=text)
        parsed = parse_tool_calls(text)
        if parsed.parse_error is None:
            return ParsedReply(parsed.content, tool_calls=parsed.tool_calls)
        cut = finish_type == "length" and text.rfind(TOOL_CALL_OPEN) > text.rfind("</tool_call>")
        return ParsedReply(text, failure=TRUNCATED if cut else MALFORMED, error=parsed.parse_error)

    def tool_call_opening(self, name: str | None) -> tuple[list[int], str]:
        """(ids, text) of an assistant reply's opening as the template renders a call: up to the
        arguments of a call to `name`, or up to the call's JSON object for any function (`None`).
        The cut falls on a token boundary of the rendered call, so forced ids followed by sampled
        ones tokenize like the template's text (`"arguments":` then ` {"`, never a lone space).
        Computed once per name: every forced turn of an agent asks for the same few."""
        if name not in self._openings:
            self._openings[name] = self._tool_call_opening(name)
        return self._openings[name]

    def _tool_call_opening(self, name: str | None) -> tuple[list[int], str]:
        anchor = [{"role": "user", "content": "?"}]
        call = {"type": "function", "function": {"name": name or "f", "arguments": {ARGS_MARK: 0}}}
        base = self.render_text(anchor, None)
        full = self.render_text([*anchor, {"role": "assistant", "content": "", "tool_calls": [call]}], None, False)
        rendered = full[len(base) :]
        end = self._opening_end(rendered, name)
        if not full.startswith(base) or not rendered.startswith(self.reply_prefix + self.call_opening) or end < 0:
            raise TemplateError(
                f"tool_choice cannot be enforced: the chat template does not open a reply's tool call with "
                f"{self.call_format}"
            )
        ids = self.encode(rendered)
        keep = 0
        while keep < len(ids) and len(self.decode(ids[: keep + 1], skip_special_tokens=False)) <= end:
            keep += 1
        text = self.decode(ids[:keep], skip_special_tokens=False)
        assert rendered.startswith(text), (rendered, text)
        return ids[:keep], text

    def _opening_end(self, rendered: str, name: str | None) -> int:
        """Where the forced opening ends in a rendered reply calling `name` (whose arguments are
        `{ARGS_MARK: 0}`), or any function for None: before the arguments or the call's object."""
        return rendered.find('{"' + ARGS_MARK) if name else rendered.find("{")
