"""Golden tests of the DeepSeek-V3 family on the tiny deepseek-v3 model (DeepSeek-V3-0324's real
chat template, its marker tokens): rendering is the template's, a turn's continuation after the
sampled reply equals a full render, and calls are parsed on sampled token ids."""

from __future__ import annotations

import json

import pytest
import renderers
from transformers import GenerationConfig

from slimeish.router.renderers.base import MALFORMED, TRUNCATED
from slimeish.router.renderers.deepseek_v3 import DeepSeekV3Renderer
from slimeish.router.renderers.select import load_renderer
from slimeish.router.renderers.template import template_message
from tests.router.families import streamed_and_answered
from tests.router.test_qwen3_coder_renderer import TOOLS, call

EOS, CALLS, CALLS_END = "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"


@pytest.fixture(scope="module")
def deepseek(tiny_model_factory) -> DeepSeekV3Renderer:
    renderer = load_renderer(tiny_model_factory(family="deepseek-v3"))
    assert isinstance(renderer, DeepSeekV3Renderer)  # `auto` recognised DeepSeek-V3's template
    return renderer


OPENING = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>"


def written(name: str, args: dict | list) -> str:
    """One call as the template writes it (and the model samples it)."""
    return f"{OPENING}{name}\n```json\n{json.dumps(args)}\n```<｜tool▁call▁end｜>"


ONE_CALL = CALLS + written("add", {"a": 1, "b": 2}) + CALLS_END
TWO_CALLS = CALLS + written("add", {"a": 1}) + "\n" + written("add", {"b": 2}) + CALLS_END
PARALLEL = {"role": "assistant", "content": "", "tool_calls": [call("add", {"a": 1}), call("add", {"b": 2}, "call_2")]}
CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "add 1 and 2"},
    PARALLEL,
    {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    {"role": "tool", "tool_call_id": "call_2", "content": "4"},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "thanks"},
]


def test_render_is_the_chat_template(deepseek):
    text = deepseek.tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert deepseek.full_ids(CONVERSATION, TOOLS) == deepseek.encode(text)
    results = "<｜tool▁output▁begin｜>3<｜tool▁output▁end｜>\n<｜tool▁output▁begin｜>4<｜tool▁output▁end｜>"
    assert text.endswith(
        f"<｜Assistant｜>{TWO_CALLS}{EOS}<｜tool▁outputs▁begin｜>{results}<｜tool▁outputs▁end｜>7{EOS}"
        "<｜User｜>thanks<｜Assistant｜>"
    )


def test_the_renderers_package_differs_from_the_template(deepseek):
    """Why the package's DeepSeek-V3 renderer is not used: no `\\n` between parallel calls or results."""
    lib = renderers.DeepSeekV3Renderer(deepseek.tokenizer)
    ids = lib.render_ids([template_message(m) for m in CONVERSATION], add_generation_prompt=True)
    assert ids != deepseek.full_ids(CONVERSATION, None)
    assert "<｜tool▁call▁end｜><｜tool▁call▁begin｜>" in deepseek.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize(("anchor", "end"), [(2, 4), (2, 5), (5, 7)], ids=["one result", "two results", "a user turn"])
def test_continuation_after_a_sampled_reply_equals_a_full_render(deepseek, anchor, end):
    """The sampled reply (`anchor`), then the messages up to `end`: what a full render writes."""
    prompt = deepseek.full_ids(CONVERSATION[:anchor], None)
    output = deepseek.encode((TWO_CALLS if anchor == 2 else "7") + EOS)
    tail = CONVERSATION[anchor + 1 : end]
    rest = deepseek.continuation(prompt + output, len(output), CONVERSATION[anchor], tail, None)
    assert prompt + output + rest == deepseek.full_ids(CONVERSATION[:end], None)


def test_the_tiny_model_stops_where_deepseek_ends_a_turn(deepseek):
    config = GenerationConfig.from_pretrained(deepseek._model_path)
    assert config.eos_token_id == deepseek.eos_token_id == deepseek.tokenizer.convert_tokens_to_ids(EOS)
    assert deepseek.tokenizer.convert_tokens_to_ids("<｜User｜>") in deepseek.tokenizer.all_special_ids


PARSES = {
    "content": ("hello there" + EOS, dict(content="hello there", calls=[])),
    "one call": (ONE_CALL + EOS, dict(content=None, calls=[("add", {"a": 1, "b": 2})])),
    "parallel calls": (TWO_CALLS + EOS, dict(content=None, calls=[("add", {"a": 1}), ("add", {"b": 2})])),
    "text before and after the calls": (
        "let me add" + ONE_CALL + "done" + EOS,
        dict(content="let me add\ndone", calls=[("add", {"a": 1, "b": 2})]),
    ),
    "a call marker outside the section is content": (
        OPENING + 'add\n```json\n{"a": 1}\n```<｜tool▁call▁end｜>' + EOS,
        dict(content=OPENING + 'add\n```json\n{"a": 1}\n```<｜tool▁call▁end｜>', calls=[]),
    ),
    "a call end inside a string argument": (
        CALLS + written("echo", {"text": "<｜tool▁call▁end｜>"}) + CALLS_END + EOS,
        dict(content=None, calls=[("echo", {"text": "<｜tool▁call▁end｜>"})]),
    ),
}


@pytest.mark.parametrize("name", PARSES)
def test_parse_sampled_ids(deepseek, name):
    text, want = PARSES[name]
    parsed = deepseek.parse("", deepseek.encode(text), "", "stop", TOOLS)
    assert (parsed.content, parsed.reasoning, parsed.failure) == (want["content"], None, None)
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]
    assert got == want["calls"]
    assert all(c["id"].startswith("call_") for c in parsed.tool_calls)


@pytest.mark.parametrize(
    ("text", "finish", "failure"),
    [
        (CALLS + OPENING + "add\n{'a': 1}<｜tool▁call▁end｜>", "stop", MALFORMED),
        (CALLS + written("add", [1]) + CALLS_END, "stop", MALFORMED),
        (CALLS + OPENING + 'add\n```json\n{"a"', "length", TRUNCATED),
        (CALLS, "length", TRUNCATED),
    ],
    ids=["no json block", "arguments not an object", "cut by length", "cut after the section opened"],
)
def test_a_call_that_does_not_parse_stays_content(deepseek, text, finish, failure):
    parsed = deepseek.parse("", deepseek.encode(text + EOS * (finish == "stop")), "", finish, TOOLS)
    assert parsed.failure == failure and parsed.tool_calls == []
    assert parsed.content == text


def test_without_tools_calls_are_content(deepseek):
    parsed = deepseek.parse("", deepseek.encode(ONE_CALL + EOS), "", "stop", None)
    assert (parsed.content, parsed.tool_calls) == (ONE_CALL, [])


@pytest.mark.parametrize("name", ["add", None])
def test_forced_opening_then_the_sampled_rest_is_one_call(deepseek, name):
    ids, text = deepseek.tool_call_opening(name)
    assert text == (CALLS + OPENING + "add\n```json\n" if name else CALLS + OPENING)
    assert deepseek.encode(text) == ids
    parsed = deepseek.parse(text, deepseek.encode(ONE_CALL.removeprefix(text) + EOS), "", "stop", TOOLS)
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]
    assert got == [("add", {"a": 1, "b": 2})]


@pytest.mark.parametrize("per_chunk", [1, 7, 1000], ids=["token by token", "7 tokens a chunk", "one chunk"])
@pytest.mark.parametrize("name", PARSES)
async def test_stream_sends_what_the_unstreamed_answer_holds(deepseek, name, per_chunk):
    """Content is held back from `<｜tool▁calls▁begin｜>` on, at any chunk size."""
    text, want = PARSES[name]
    streamed, answered = await streamed_and_answered(deepseek, deepseek.encode(text), TOOLS, per_chunk)
    assert streamed == answered == (want["content"], None, want["calls"])
