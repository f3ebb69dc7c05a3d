"""`--renderer`: the model family's renderer, named or recognised from the model's tokenizer."""

from __future__ import annotations

from pathlib import Path

from slimeish.router.renderers.base import Renderer
from slimeish.router.renderers.deepseek_v3 import DeepSeekV3Renderer
from slimeish.router.renderers.glm45 import GLM45Renderer
from slimeish.router.renderers.llama3 import Llama3Renderer
from slimeish.router.renderers.qwen3 import Qwen3Renderer
from slimeish.router.renderers.qwen3_coder import Qwen3CoderRenderer
from slimeish.router.renderers.template import ChatRenderer

FAMILIES: dict[str, type[ChatRenderer]] = {
    "template": ChatRenderer,
    "qwen3": Qwen3Renderer,
    "qwen3-coder": Qwen3CoderRenderer,
    "glm-4.5": GLM45Renderer,
    "llama3": Llama3Renderer,
    "deepseek-v3": DeepSeekV3Renderer,
}
# The families `auto` tells apart by their templates.
RECOGNISED = (Qwen3Renderer, Qwen3CoderRenderer, GLM45Renderer, Llama3Renderer, DeepSeekV3Renderer)


def family_of(template: ChatRenderer) -> str:
    """The family whose format the model's chat template writes: recognised by the markup that
    only that family's template holds (a fine-tune keeps its base's template, not its name)."""
    source, vocab = template.tokenizer.chat_template or "", template.tokenizer.get_vocab()
    return next((r.family for r in RECOGNISED if r.recognises(source, vocab)), "template")


def load_renderer(model: str | Path, choice: str = "auto") -> Renderer:
    if choice != "auto" and choice not in FAMILIES:
        raise ValueError(f"--renderer {choice!r}: expected auto or one of {', '.join(FAMILIES)}")
    template = ChatRenderer(model)
    family = family_of(template) if choice == "auto" else choice
    return template if family == "template" else FAMILIES[family](model, template.tokenizer)
