"""Families rendered and bridged by the `renderers` package (its Python mirror of the family's
Jinja template; golden tests check it against the template).

These templates drop the reasoning of turns before the last user query, so the tail of a
conversation is not the rendering of its new messages alone: a turn continues from the
segment's exact sampled tokens (the bridge), whether or not the agent sends its reasoning back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from slimeish.router.jsontypes import JSONObject
from slimeish.router.renderers.arguments import with_argument_objects
from slimeish.router.renderers.base import TemplateError
from slimeish.router.renderers.template import ChatRenderer, template_message


class BridgedRenderer(ChatRenderer):
    format_name = ""  # the family as error messages name it
    # Calls' JSON-text arguments rendered as the objects the template iterates over (and refused
    # when not an object), where the package would render them as sent or as `{}`.
    argument_objects = False

    def __init__(self, model_path: str | Path, tokenizer: PreTrainedTokenizerBase | None = None):
        super().__init__(model_path, tokenizer)
        self._lib = self.library()  # the package's renderer for the family, built on this tokenizer
        self._stops = set(self._lib.get_stop_token_ids())

    def library(self) -> Any:
        """The `renderers` package's renderer of this family on `self.tokenizer`."""
        raise NotImplementedError

    def library_message(self, message: JSONObject) -> JSONObject:
        """A chat-format message as the package's renderer reads it."""
        message = template_message(message)
        return with_argument_objects(message) if self.argument_objects else message

    def render_text(
        self, messages: list[JSONObject], tools: list[JSONObject] | None, generation_prompt: bool = True
    ) -> str:
        if self.argument_objects:
            messages = [with_argument_objects(m) for m in messages]
        return super().render_text(messages, tools, generation_prompt)

    def full_ids(self, messages: list[JSONObject], tools: list[JSONObject] | None) -> list[int]:
        try:
            msgs = [self.library_message(m) for m in messages]
            ids: list[int] = self._lib.render_ids(msgs, tools=tools or None, add_generation_prompt=True)
            return ids
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise TemplateError(f"cannot render these messages in {self.format_name}'s format: {e}") from e

    def continuation(
        self,
        tokens: list[int],
        output_len: int,
        anchor: JSONObject,
        tail: list[JSONObject],
        tools: list[JSONObject] | None,
    ) -> list[int]:
        cut = len(tokens) - output_len
        new = [self.library_message(m) for m in tail]
        bridged = self._lib.bridge_to_next_turn(tokens[:cut], tokens[cut:], new, tools=tools or None)
        if bridged is None or bridged.token_ids[: len(tokens)] != tokens:
            raise TemplateError(f"the {self.format_name} renderer cannot continue this reply from its sampled tokens")
        tail_ids: list[int] = bridged.token_ids[len(tokens) :]
        return tail_ids
