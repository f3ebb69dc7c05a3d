"""`tool_choice` enforced by forcing a prefix: the template's opening of a tool call is appended
to the prompt, recorded as prompt (loss mask 0), and parsed together with the sampled text.

The random tiny model rarely writes arguments that parse, so the end-to-end tests accept either
outcome and check each exactly: a call to the named function, or the forced plus sampled text
returned as content and counted as a parse failure. Parsing calls that do succeed is checked on
fixed "sampled" text, through capture and through the stream.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import httpx
import orjson
import pytest
from openai.types.chat import ChatCompletionChunk

from slimeish.router.capture import Capture
from slimeish.router.dialects.chat import chat_events
from slimeish.router.metrics import RouterMetrics
from slimeish.router.pipeline import assistant_message, forced_start
from slimeish.router.renderers.template import ChatRenderer, TemplateError
from slimeish.router.schemas import ChatRequest, validate_messages
from slimeish.router.streaming import ReplyStream, StreamedTurn
from slimeish.router.tool_parser import parse_tool_calls
from tests.router.test_openai_sdk import TOOLS, assert_exact_capture, client_for
from tests.router.test_streaming import engine_stream

MESSAGES = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "what is 1 + 2?"}]
NAMED = {"type": "function", "function": {"name": "add"}}
NAMED_OPENING = '<tool_call>\n{"name": "add", "arguments":'
SAMPLED_CALL = ' {"a": 1, "b": 2}}\n</tool_call>'  # what a model that follows the template writes next


def opening(renderer: ChatRenderer, tool_choice) -> tuple[list[int], str]:
    return forced_start(renderer, ChatRequest(messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice).tool_choice)


def test_openings_are_the_templates_own_cut_on_a_token_boundary(renderer):
    ids, text = opening(renderer, NAMED)
    assert text == NAMED_OPENING  # no trailing space: the template's text tokenizes `":` then ` {"`
    base = renderer.render_text(MESSAGES, TOOLS)
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    rendered = renderer.render_text([*MESSAGES, {"role": "assistant", "tool_calls": [call]}], TOOLS, False)
    assert rendered == base + text + SAMPLED_CALL + "<|im_end|>\n"
    assert renderer.encode(rendered)[: len(renderer.encode(base)) + len(ids)] == renderer.encode(base) + ids
    assert opening(renderer, "required") == (renderer.encode("<tool_call>\n"), "<tool_call>\n")
    assert opening(renderer, "auto") == opening(renderer, "none") == opening(renderer, None) == ([], "")


def test_a_template_without_tool_call_markup_cannot_force(tiny_model):
    plain = ChatRenderer(tiny_model)
    plain.tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateError, match="tool_choice cannot be enforced"):
        plain.tool_call_opening("add")


def test_forced_ids_are_prompt_and_the_parsed_reply_extends_the_segment(renderer):
    cap = Capture(renderer)
    forced_ids, forced = opening(renderer, NAMED)
    unforced = cap.plan_chat(MESSAGES, TOOLS, validate_messages)
    plan = unforced.with_forced(forced_ids)
    assert plan.input_ids == plan.prompt_ids == renderer.full_ids(MESSAGES, TOOLS) + forced_ids
    assert unforced.input_ids == renderer.full_ids(MESSAGES, TOOLS)  # planning state is not shared
    sampled = [*renderer.encode(SAMPLED_CALL), renderer.eos_token_id]
    parsed = parse_tool_calls(forced + renderer.decode(sampled))
    assert parsed.content is None and parsed.parse_error is None
    reply = {"role": "assistant", "content": None, "tool_calls": parsed.tool_calls}
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply["tool_calls"]] == [
        ("add", {"a": 1, "b": 2})
    ]
    committed = cap.commit(plan, sampled, reply=reply)
    assert committed.prompt_ids == plan.input_ids  # the forced ids are recorded with the prompt
    # rendering the reply reproduces prompt + forced + sampled tokens (then the template's "\n")
    messages = [*MESSAGES, reply]
    rendered = renderer.encode(renderer.render_text(messages, TOOLS, False))
    assert rendered == [*cap.segments[0].tokens, *renderer.encode("\n")]
    result = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "3"}
    following = cap.plan_chat([*messages, result], TOOLS, validate_messages)
    assert (following.segment_index, following.split_reason) == (0, None)
    assert following.input_ids[: len(cap.segments[0].tokens)] == cap.segments[0].tokens


async def test_stream_deltas_carry_the_forced_part_of_the_call(renderer):
    _, forced = opening(renderer, NAMED)
    state = SimpleNamespace(metrics=RouterMetrics(), renderer=renderer)
    head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    for sampled, parses in ((SAMPLED_CALL, True), (' {"a": 1', False)):
        result = StreamedTurn()
        replies = ReplyStream(1, True, [], forced)
        to_message = lambda g: assistant_message(state, g, True, forced)  # noqa: E731
        events = chat_events(engine_stream(sampled, 3), head, replies, to_message, None, result)
        sent = [e async for e in events] + result.closing
        chunks = [ChatCompletionChunk.model_validate(orjson.loads(e[6:])) for e in sent]
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        calls = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
        if parses:
            assert content == "" and chunks[-1].choices[0].finish_reason == "tool_calls"
            assert [(tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [
                ("add", {"a": 1, "b": 2})
            ]
        else:
            assert content == forced + sampled and calls == []
        assert result.answers[0]["content"] == (content or None)  # what the client assembled is recorded
    assert state.metrics.tool_parse_failures._value.get() == 1


def parse_failures(router_app) -> float:
    text = httpx.get(router_app.url + "/metrics").text
    return float(re.search(r"^router_tool_call_parse_failures_total (\S+)$", text, re.M).group(1))


def check_choice(message, forced: str, sampled_text: str, tool_choice) -> bool:
    """A forced reply is a call (to the named function) or, if it did not parse, the whole text.
    Returns whether it was a parse failure."""
    if message.tool_calls:
        assert message.content is None
        if tool_choice == NAMED:
            assert message.tool_calls[0].function.name == "add"
        return False
    assert message.content == forced + sampled_text
    return True


@pytest.mark.parametrize("tool_choice", [NAMED, "required"])
def test_forced_turns_with_n_choices_are_captured_exactly(router_app, renderer, tool_choice):
    session = router_app.new_session()
    forced_ids, forced = opening(renderer, tool_choice)
    failures = parse_failures(router_app)
    r = client_for(session).chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, n=2, max_tokens=8, temperature=1.0
    )
    request, items = router_app.engine_log[-1]
    assert request["input_ids"] == renderer.full_ids(MESSAGES, TOOLS) + forced_ids
    assert r.usage.prompt_tokens == len(request["input_ids"])
    failed = [
        check_choice(c.message, forced, item["text"], tool_choice) for c, item in zip(r.choices, items, strict=True)
    ]
    assert parse_failures(router_app) == failures + sum(failed)
    turns = router_app.store.turns[session["session_id"]]  # each choice's parse outcome is recorded
    assert [t.parse_failure in ("malformed", "truncated") for t in turns] == failed
    assert [t.parse_failure is None for t in turns] == [not f for f in failed]
    assert [t.tool_calls for t in turns] == [len(c.message.tool_calls or []) for c in r.choices]
    samples = router_app.store.samples(session["session_id"])
    assert len(samples) == 2
    for sample, item in zip(samples, items, strict=True):  # forced ids are prompt: mask 1 only on sampled ids
        assert_exact_capture(sample, [(request, item)], renderer)


@pytest.mark.parametrize("tool_choice", [NAMED, "required"])
def test_streamed_forced_turn_then_an_extending_turn(router_app, renderer, tool_choice):
    session = router_app.new_session()
    client = client_for(session)
    forced_ids, forced = opening(renderer, tool_choice)
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, max_tokens=8, stream=True
    )
    chunks = list(stream)
    request, response = router_app.engine_log[-1]
    assert request["input_ids"][-len(forced_ids) :] == forced_ids
    sampled_text, output_ids = response["chunks"][-1]["text"], response["chunks"][-1]["output_ids"]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
    if calls:  # the assembled call is complete: name and arguments, forced part included
        assert content == "" and isinstance(json.loads(calls[0].function.arguments), dict)
        if tool_choice == NAMED:
            assert calls[0].function.name == "add"
        reply = {"role": "assistant", "tool_calls": [tc.model_dump(exclude={"index"}) for tc in calls]}
        follow_up = {"role": "tool", "tool_call_id": calls[0].id, "content": "3"}
    else:
        assert content == forced + sampled_text
        reply, follow_up = {"role": "assistant", "content": content}, {"role": "user", "content": "try again"}
    # the client sends back what it assembled; auto forces nothing, and the segment just grows
    client.chat.completions.create(model="tiny", messages=[*MESSAGES, reply, follow_up], tools=TOOLS, max_tokens=2)
    turns = router_app.store.turns[session["session_id"]]
    assert [t.segment_index for t in turns] == [0, 0]
    assert (turns[0].tool_calls, turns[0].parse_failure is None) == ((1, True) if calls else (0, False))
    assert turns[0].prompt_ids == request["input_ids"] and turns[0].output_ids == output_ids
    second = router_app.engine_log[-1][0]["input_ids"]
    assert second[: len(request["input_ids"]) + len(output_ids)] == request["input_ids"] + output_ids


def test_a_call_cut_by_a_stop_string_is_recorded_as_malformed(router_app):
    """Greedy, the tiny model follows the forced opening with `":`; the agent's stop string ends
    the reply there, inside the call: a complete reply whose call does not parse."""
    session = router_app.new_session()
    r = client_for(session).chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=NAMED, max_tokens=8, temperature=0, stop=['"', ":"]
    )
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    (turn,) = router_app.store.turns[session["session_id"]]
    assert (turn.parse_failure, turn.tool_calls) == ("malformed", 0)
    (sample,) = router_app.store.samples(session["session_id"])
    assert sample.metadata["tool_parse"] == {"calls": 0, "failures": {"malformed": 1}}


@pytest.mark.parametrize("tool_choice", ["auto", "none"])
def test_auto_and_none_force_nothing(router_app, renderer, tool_choice):
    session = router_app.new_session()
    r = client_for(session).chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, max_tokens=4
    )
    request, response = router_app.engine_log[-1]
    assert request["input_ids"] == renderer.full_ids(MESSAGES, TOOLS)
    if tool_choice == "none":
        assert r.choices[0].message.content == response["text"] and not r.choices[0].message.tool_calls
