"""Golden tests of the Llama 3.x family on the tiny llama3 model (Llama 3.2's real chat template,
its special tokens): rendering by the `renderers` package against the template, the bridge after
a sampled reply against a full render, and the JSON call parser on sampled token ids."""

from __future__ import annotations

import json

import pytest
from transformers import GenerationConfig

from slimeish.router.renderers.base import MALFORMED, TRUNCATED, TemplateError
from slimeish.router.renderers.llama3 import Llama3Renderer
from slimeish.router.renderers.select import load_renderer
from tests.router.families import streamed_and_answered
from tests.router.test_qwen3_coder_renderer import TOOLS, call, with_object


@pytest.fixture(scope="module")
def llama(tiny_model_factory) -> Llama3Renderer:
    renderer = load_renderer(tiny_model_factory(family="llama3"))
    assert isinstance(renderer, Llama3Renderer)  # `auto` recognised Llama 3's template
    return renderer


ONE_CALL = '{"name": "add", "parameters": {"a": 1, "b": 2}}'
REPLY = {"role": "assistant", "content": "", "tool_calls": [call("add", {"a": 1, "b": 2})]}
CONVERSATIONS = {
    "one user turn": [{"role": "user", "content": "hi"}],
    "system": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "add 1 and 2"}],
    "tool cycle": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "add 1 and 2"},
        REPLY,
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
        {"role": "assistant", "content": "3"},
        {"role": "user", "content": "thanks"},
    ],
}


def template_ids(llama: Llama3Renderer, messages: list[dict], tools: list[dict] | None) -> list[int]:
    objects = [
        {**m, "tool_calls": [with_object(c) for c in m["tool_calls"]]} if "tool_calls" in m else m for m in messages
    ]
    text = llama.tokenizer.apply_chat_template(
        objects, tools=tools, tokenize=False, add_generation_prompt=True, date_string="26 Jul 2024"
    )
    return llama.encode(text)


@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_render_is_the_chat_template(llama, name, tools):
    """The package's renderer writes what Llama 3.2's template writes on its fallback date."""
    assert llama.full_ids(CONVERSATIONS[name], tools) == template_ids(llama, CONVERSATIONS[name], tools)


def test_a_call_renders_as_llama_writes_it(llama):
    text = llama.render_text([{"role": "user", "content": "q"}, REPLY], None, generation_prompt=False)
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n" + ONE_CALL + "<|eot_id|>")


def test_arguments_that_are_not_an_object_are_refused(llama):
    bad = {**REPLY, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "add", "arguments": "[1]"}}]}
    with pytest.raises(TemplateError, match="not a JSON object"):
        llama.full_ids([{"role": "user", "content": "q"}, bad], TOOLS)


def test_bridge_after_the_sampled_call_equals_a_full_render(llama):
    history = CONVERSATIONS["tool cycle"]
    prompt = llama.full_ids(history[:2], TOOLS)
    output = llama.encode(ONE_CALL + "<|eot_id|>")
    tail = llama.continuation(prompt + output, len(output), REPLY, history[3:4], TOOLS)
    assert prompt + output + tail == llama.full_ids(history[:4], TOOLS)


def test_bridge_after_a_reply_cut_by_length_closes_the_turn(llama):
    prompt = llama.full_ids([{"role": "user", "content": "hi"}], None)
    output = llama.encode("hel")
    tail = llama.continuation(prompt + output, len(output), {}, [{"role": "user", "content": "go on"}], None)
    assert llama.decode(tail, skip_special_tokens=False).startswith("<|eot_id|><|start_header_id|>user")


def test_the_tiny_model_stops_where_llama_ends_a_turn(llama):
    config = GenerationConfig.from_pretrained(llama._model_path)
    stops = llama.tokenizer.convert_tokens_to_ids(["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"])
    assert sorted(config.eos_token_id) == sorted(stops) and set(stops) == llama._stops
    assert llama.tokenizer.convert_tokens_to_ids("<|python_tag|>") in llama.tokenizer.all_special_ids


PARSES = {
    "content": ("hello there<|eot_id|>", dict(content="hello there", calls=[])),
    "a brace later in the reply is content": ("use {x}: done<|eot_id|>", dict(content="use {x}: done", calls=[])),
    "one call": (ONE_CALL + "<|eot_id|>", dict(content=None, calls=[("add", {"a": 1, "b": 2})])),
    "a call after <|python_tag|>, ended by <|eom_id|>": (
        "<|python_tag|>" + ONE_CALL + "<|eom_id|>",
        dict(content=None, calls=[("add", {"a": 1, "b": 2})]),
    ),
    "arguments instead of parameters": (
        '{"name": "write", "arguments": {"path": "a.txt"}}<|eot_id|>',
        dict(content=None, calls=[("write", {"path": "a.txt"})]),
    ),
    "parallel calls separated by ;": (
        '{"name": "add", "parameters": {"a": 1}}; {"name": "add", "parameters": {"b": 2}}<|eot_id|>',
        dict(content=None, calls=[("add", {"a": 1}), ("add", {"b": 2})]),
    ),
}


@pytest.mark.parametrize("name", PARSES)
def test_parse_sampled_ids(llama, name):
    text, want = PARSES[name]
    parsed = llama.parse("", llama.encode(text), "", "stop", TOOLS)
    assert (parsed.content, parsed.reasoning, parsed.failure) == (want["content"], None, None)
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]
    assert got == want["calls"]
    assert all(c["id"].startswith("call_") for c in parsed.tool_calls)


@pytest.mark.parametrize(
    ("text", "finish", "failure"),
    [
        ('{"name": "add", "parameters": {"a": 1}<|eot_id|>', "stop", MALFORMED),
        ('{"answer": 3}<|eot_id|>', "stop", MALFORMED),
        (ONE_CALL + " and more<|eot_id|>", "stop", MALFORMED),
        ('{"name": "add", "parame', "length", TRUNCATED),
    ],
    ids=["unclosed", "not a call", "text after the call", "cut by length"],
)
def test_a_call_that_does_not_parse_stays_content(llama, text, finish, failure):
    parsed = llama.parse("", llama.encode(text), "", finish, TOOLS)
    assert parsed.failure == failure and parsed.tool_calls == []
    assert parsed.content == text.removesuffix("<|eot_id|>")


def test_without_tools_calls_are_content(llama):
    parsed = llama.parse("", llama.encode(ONE_CALL + "<|eot_id|>"), "", "stop", None)
    assert (parsed.content, parsed.tool_calls) == (ONE_CALL, [])


@pytest.mark.parametrize("name", ["add", None])
def test_forced_opening_then_the_sampled_rest_is_one_call(llama, name):
    ids, text = llama.tool_call_opening(name)
    assert text == ('{"name": "add", "parameters":' if name else '{"name": "')
    assert llama.encode(text) == ids
    parsed = llama.parse(text, llama.encode(ONE_CALL.removeprefix(text) + "<|eot_id|>"), "", "stop", TOOLS)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == [
        ("add", {"a": 1, "b": 2})
    ]


@pytest.mark.parametrize("per_chunk", [1, 7, 1000], ids=["token by token", "7 tokens a chunk", "one chunk"])
@pytest.mark.parametrize("name", PARSES)
async def test_stream_sends_what_the_unstreamed_answer_holds(llama, name, per_chunk):
    """Content is held back while the reply may still open a call (`{` first), at any chunk size."""
    text, want = PARSES[name]
    streamed, answered = await streamed_and_answered(llama, llama.encode(text), TOOLS, per_chunk)
    assert streamed == answered == (want["content"], None, want["calls"])


@pytest.mark.parametrize("text", ['{"answer": 3}<|eot_id|>', ONE_CALL + " and more<|eot_id|>"])
async def test_a_json_reply_that_is_no_call_streams_as_content(llama, text):
    """Held back while it could be a call, then sent whole: the agent gets what the answer holds."""
    streamed, answered = await streamed_and_answered(llama, llama.encode(text), TOOLS, 3)
    assert streamed == answered == (text.removesuffix("<|eot_id|>"), None, [])


PARALLEL_REPLY = {
    "role": "assistant",
    "content": "",
    "tool_calls": [call("add", {"a": 1}), call("add", {"b": 2}, "c2")],
}
RESULTS = [
    {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    {"role": "tool", "tool_call_id": "c2", "content": "4"},
]


def test_parallel_calls_continue_from_their_sampled_tokens(llama):
    """The template renders one call per message (it raises on more): parallel calls the model
    wrote (`;` between) continue from their sampled tokens, with both results as the template
    writes tool results; only a history that must be rendered whole is refused."""
    history = CONVERSATIONS["system"]
    prompt = llama.full_ids(history, TOOLS)
    output = llama.encode('{"name": "add", "parameters": {"a": 1}}; {"name": "add", "parameters": {"b": 2}}<|eot_id|>')
    tail = llama.continuation(prompt + output, len(output), PARALLEL_REPLY, RESULTS, TOOLS)
    one_call = [*history, REPLY]  # the results' rendering does not depend on the call before them
    base = llama.render_text(one_call, TOOLS, generation_prompt=False)
    full = llama.render_text([*one_call, *RESULTS], TOOLS)
    assert llama.decode(tail, skip_special_tokens=False) == full[len(base) :]
    with pytest.raises(TemplateError, match="single tool call"):
        llama.full_ids([*history, PARALLEL_REPLY, *RESULTS], TOOLS)
