"""One session, three dialects: every dialect becomes the same conversation, so an agent that
switches API mid-episode and sends back what it got still extends one segment, tool calls and
reasoning included."""

from __future__ import annotations

import anthropic
import httpx

from tests.router import test_anthropic_sdk as A
from tests.router import test_openai_sdk as C
from tests.router import test_reasoning_sdk as R
from tests.router import test_responses_sdk as O
from tests.router.reasoning_model import CONTENT, REASONING
from tests.router.test_anthropic_sdk import engine_calls
from tests.router.test_openai_sdk import assert_exact_capture, client_for


def test_chat_then_messages_then_responses_is_one_segment(router_app, renderer):
    session = router_app.new_session(group_id="g-mixed")
    openai_client = client_for(session)
    claude = anthropic.Anthropic(base_url=session["base_url"].removesuffix("/v1"), api_key="x", max_retries=0)
    start = len(router_app.engine_log)

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    first = openai_client.chat.completions.create(model="tiny", messages=chat, max_tokens=4).choices[0].message
    said = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": first.content}]

    second = claude.messages.create(
        model="tiny", system="Be brief.", max_tokens=4, messages=[*said, {"role": "user", "content": "more"}]
    )
    said += [{"role": "user", "content": "more"}, {"role": "assistant", "content": second.content[0].text}]

    openai_client.responses.create(
        model="tiny", instructions="Be brief.", max_output_tokens=4, input=[*said, {"role": "user", "content": "again"}]
    )

    r = httpx.post(
        f"{router_app.url}/sessions/{session['session_id']}/finish", json={"reward": 1}, headers=router_app.admin
    )
    assert r.status_code == 200, r.text
    assert [t.segment_index for t in router_app.store.turns[session["session_id"]]] == [0, 0, 0]
    (sample,) = router_app.store.samples(session["session_id"])
    assert_exact_capture(sample, engine_calls(router_app.engine_log[start:]), renderer)


# -- a tool call sampled in one dialect, answered in another ---------------------------------------
# The reasoning model (tests/router/reasoning_model.py) really samples a call to `add` when
# tool_choice forces it (`{}` closing it) and `<think>sum</think>add` otherwise.
SYSTEM = "You add numbers."
model, router = R.model, R.router  # its engine and router: the fixtures of test_reasoning_sdk.py
FORCE_CHAT = {"type": "function", "function": {"name": "add"}}


def chat_call(item) -> dict:
    """A Responses `function_call` item as a chat `tool_calls` entry."""
    return {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}


def test_a_call_sampled_over_chat_is_answered_over_messages_then_responses_then_chat(router, model):
    session = router.new_session()
    chat = client_for(session)
    claude = A.client_for(session)
    start = len(router.engine_log)
    system = [{"role": "system", "content": SYSTEM}]

    # chat: the forced call
    asked = [{"role": "user", "content": "1 + 2?"}]
    r = chat.chat.completions.create(
        model="tiny", messages=[*system, *asked], tools=C.TOOLS, tool_choice=FORCE_CHAT, max_tokens=16
    )
    (call,) = r.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("add", "{}")

    # Messages: the call as a tool_use block, its output as a tool_result; the reply reasons, then answers
    use = {"type": "tool_use", "id": call.id, "name": "add", "input": {}}
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "3"}
    messages = [*asked, {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    m = claude.messages.create(model="tiny", system=SYSTEM, tools=A.TOOLS, max_tokens=16, messages=messages)
    thinking, text = m.content
    assert (thinking.thinking, text.text, m.stop_reason) == (REASONING, CONTENT, "end_turn")

    # Responses: the same history as items, the thinking as a reasoning item under its signature;
    # another forced call
    items = [
        *asked,
        {"type": "function_call", "call_id": call.id, "name": "add", "arguments": "{}"},
        {"type": "function_call_output", "call_id": call.id, "output": "3"},
        {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": thinking.thinking}],
            "encrypted_content": thinking.signature,
        },
        {"role": "assistant", "content": text.text},
        {"role": "user", "content": "and 2 + 2?"},
    ]
    force = {"type": "function", "name": "add"}
    resp = chat.responses.create(
        model="tiny", instructions=SYSTEM, tools=O.TOOLS, tool_choice=force, max_output_tokens=16, input=items
    )
    (second,) = resp.output
    assert (second.type, second.name, second.arguments) == ("function_call", "add", "{}")

    # chat again: the Responses call answered by a tool message
    said = [
        *system,
        *asked,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "3"},
        {"role": "assistant", "content": text.text, "reasoning_content": thinking.thinking},
        {"role": "user", "content": "and 2 + 2?"},
        {"role": "assistant", "content": None, "tool_calls": [chat_call(second)]},
        {"role": "tool", "tool_call_id": second.call_id, "content": "4"},
    ]
    last = chat.chat.completions.create(model="tiny", messages=said, tools=C.TOOLS, max_tokens=16)
    assert last.choices[0].message.content == CONTENT

    turns = router.store.turns[session["session_id"]]
    assert [(t.segment_index, t.split_reason) for t in turns] == [(0, None)] * 4
    R.one_exact_segment(router, model, session, start, 4)
