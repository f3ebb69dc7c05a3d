"""Qwen3 (hybrid thinking): reasoning in `<think>…</think>`, Hermes calls, bridged from sampled tokens.

Rendering and bridging come from the `renderers` package's hand-written Qwen3 renderer
(`BridgedRenderer`: each turn continues from the segment's exact sampled tokens).

Parsing is slimeish's own, on token ids: a reply that opens with `<think>` and closes it holds
reasoning; a `</think>` that never came leaves the whole reply as content (the reply is not
swallowed into reasoning); calls count only after the reasoning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import renderers
from transformers import PreTrainedTokenizerBase

from slimeish.router.jsontypes import JSONObject
from slimeish.router.renderers.base import ParsedReply
from slimeish.router.renderers.bridged import BridgedRenderer
from slimeish.router.renderers.calls import tagged_calls
from slimeish.router.tool_parser import parse_call

THINK, THINK_END, CALL, CALL_END = "<think>", "</think>", "<tool_call>", "</tool_call>"


class Qwen3Renderer(BridgedRenderer):
    family = "qwen3"
    format_name = "Qwen3"
    reply_prefix = "<think>\n\n</think>\n\n"  # a reply the template renders with no reasoning
    reasoning_markers = (THINK, THINK_END)
    # Bridged: an episode stays one sample holding each reply's reasoning as it was sampled. The
    # template would drop it at every new user query (and split the episode there).
    next_turn_prompt = "sampled"

    def __init__(self, model_path: str | Path, tokenizer: PreTrainedTokenizerBase | None = None):
        super().__init__(model_path, tokenizer)
        self._think, self._think_end, self._call, self._call_end = map(
            self._token_id, (THINK, THINK_END, CALL, CALL_END)
        )

    def library(self) -> Any:
        # "all": bridge across user queries too (the template would re-render without old reasoning).
        return renderers.Qwen3Renderer(self.tokenizer, renderers.Qwen3RendererConfig(thinking_retention="all"))

    @staticmethod
    def recognises(template: str, vocab: dict[str, int]) -> bool:
        """Qwen3's template: ChatML turns, reasoning kept after the last query, Hermes calls."""
        markers = ("<|im_start|>", "last_query_index", "reasoning_content", "<tool_call>")
        hermes = "<function=" not in template  # Qwen3.5's template writes XML calls instead
        return (
            hermes
            and all(m in template for m in markers)
            and all(t in vocab for t in (THINK, THINK_END, CALL, CALL_END))
        )

    def parse(
        self, forced: str, output_ids: list[int], text: str, finish_type: str, tools: list[JSONObject] | None
    ) -> ParsedReply:
        ids = self._reply_ids(forced, output_ids, self._stops)
        reasoning, body = None, ids
        if ids[:1] == [self._think] and self._think_end in ids:
            end = ids.index(self._think_end)
            reasoning, body = self._text(ids[1:end]).strip("\n"), ids[end + 1 :]
        if not tools or self._call not in body:
            content = self._text(body)
            return ParsedReply(content.lstrip("\n") if reasoning is not None else content, reasoning)
        return tagged_calls(body, (self._call, self._call_end), self._text, parse_call, finish_type, reasoning)
