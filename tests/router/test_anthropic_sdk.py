"""The real `anthropic` SDK against the router's Messages API and a real embedded engine.

As with the `openai` SDK (test_openai_sdk.py), a recording proxy logs what the engine received
and sampled, and the stored sample must equal exactly that. The random tiny model rarely writes a
tool call that parses, so the episode answers whatever it got: `tool_result` blocks for each
`tool_use`, else a user message; a tool_result turn on a reply the router did give is tested on
fixed "sampled" text through capture.
"""

from __future__ import annotations

import anthropic
import httpx
import pytest

from slimeish.router.capture import Capture
from slimeish.router.dialects.messages import MessagesRequest, chat_messages, content_blocks, stop_reason
from slimeish.router.turns import Generation, parse_generation
from tests.router.test_openai_sdk import assert_exact_capture

TOOLS = [
    {
        "name": "add",
        "description": "add two numbers",
        "input_schema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    }
]


def client_for(session: dict, **kw) -> anthropic.Anthropic:
    """The SDK appends `/v1/messages` to its base URL: the session's base_url without `/v1`."""
    return anthropic.Anthropic(base_url=session["base_url"].removesuffix("/v1"), api_key="unused", max_retries=0, **kw)


def engine_calls(log: list) -> list[tuple[dict, dict]]:
    """(request, response) per engine call; a stream's last chunk holds everything sampled."""
    return [(req, resp["chunks"][-1] if "chunks" in resp else resp) for req, resp in log]


def answer(content: list) -> dict:
    """What an agent sends after a reply: a tool_result for each tool_use, else more text."""
    results = [{"type": "tool_result", "tool_use_id": b.id, "content": "3"} for b in content if b.type == "tool_use"]
    return {"role": "user", "content": results or "and 2 + 2?"}


def test_messages_episode_create_stream_tool_choice_is_captured_exactly(router_app, renderer):
    session = router_app.new_session(group_id="g-anthropic")
    client = client_for(session)
    start = len(router_app.engine_log)
    messages: list[dict] = [{"role": "user", "content": "what is 1 + 2?"}]
    kw = {"model": "tiny", "system": "You add numbers.", "tools": TOOLS, "max_tokens": 6}
    r = client.messages.create(messages=messages, tool_choice={"type": "tool", "name": "add"}, **kw)
    assert r.type == "message" and r.role == "assistant"
    assert r.stop_reason in ("tool_use", "max_tokens", "end_turn")
    assert r.usage.output_tokens == len(router_app.engine_log[-1][1]["output_ids"])
    messages += [{"role": "assistant", "content": [b.model_dump() for b in r.content]}, answer(r.content)]
    with client.messages.stream(messages=messages, **kw) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == "".join(b.text for b in final.content if b.type == "text")
    assert final.usage.output_tokens == len(router_app.engine_log[-1][1]["chunks"][-1]["output_ids"])
    messages += [{"role": "assistant", "content": [b.model_dump() for b in final.content]}, answer(final.content)]
    client.messages.create(messages=messages, **kw)

    calls = engine_calls(router_app.engine_log[start:])
    assert len(calls) == 3
    r = httpx.post(
        f"{router_app.url}/sessions/{session['session_id']}/finish", json={"reward": 1.0}, headers=router_app.admin
    )
    assert r.status_code == 200, r.text
    (sample,) = router_app.store.samples(session["session_id"])
    assert sample.split_reason is None
    assert_exact_capture(sample, calls, renderer)
    assert [t.segment_index for t in router_app.store.turns[session["session_id"]]] == [0, 0, 0]


def test_x_api_key_on_v1_and_count_tokens(router_app, renderer):
    session = router_app.new_session()
    client = anthropic.Anthropic(base_url=router_app.url, api_key=session["api_key"], max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    counted = client.messages.count_tokens(model="tiny", system="be brief", messages=msgs, tools=TOOLS)
    system = {"role": "system", "content": "be brief"}
    tools = [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]},
        }
        for t in TOOLS
    ]
    assert counted.input_tokens == len(renderer.full_ids([system, *msgs], tools))
    r = client.messages.create(model="tiny", system="be brief", messages=msgs, tools=TOOLS, max_tokens=2)
    assert r.usage.input_tokens == counted.input_tokens
    assert router_app.record(session["session_id"])["turns"] == 1


def test_a_tool_result_turn_extends_the_reply_it_answers(renderer):
    """A reply with a tool call (fixed text standing in for a sampled one) comes back as the
    agent's tool_use blocks plus tool_result: the next turn extends the segment."""
    cap = Capture(renderer)
    first = MessagesRequest.model_validate(
        {"max_tokens": 5, "system": "s", "tools": TOOLS, "messages": [{"role": "user", "content": "1 + 2?"}]}
    )
    tools = [
        {
            "type": "function",
            "function": {"name": "add", "description": "add two numbers", "parameters": TOOLS[0]["input_schema"]},
        }
    ]
    plan = cap.plan_chat(chat_messages(first, lambda ref, text: True), tools, lambda m, s: None)
    sampled = renderer.encode('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
        ],
    }
    cap.commit(plan, [*sampled, renderer.eos_token_id], reply=reply)
    blocks = content_blocks(reply, lambda text: "unused: the reply has no reasoning")
    assert blocks == [{"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}}]
    second = MessagesRequest.model_validate(
        {
            "max_tokens": 5,
            "system": "s",
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": "1 + 2?"},
                {"role": "assistant", "content": blocks},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3", "is_error": False}],
                },
            ],
        }
    )
    following = cap.plan_chat(chat_messages(second, lambda ref, text: True), tools, lambda m, s: None)
    assert (following.segment_index, following.split_reason) == (0, None)
    assert following.input_ids[: len(cap.segments[0].tokens)] == cap.segments[0].tokens


def assert_anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]["message"]


GOOD = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
BAD = {
    "no max_tokens": ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    "image block": (
        {**GOOD, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]},
        "messages.0",
    ),
    "orphan tool_result": (
        {**GOOD, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}]}]},
        "toolu_9",
    ),
    "tool_use from the user": (
        {
            **GOOD,
            "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "add", "input": {}}]}],
        },
        "assistant message",
    ),
    "server tool": ({**GOOD, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
    "unknown tool_choice": ({**GOOD, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "mul"}}, "mul"),
    "temperature": ({**GOOD, "temperature": 1.5}, "temperature"),
}


@pytest.mark.parametrize("case", list(BAD.values()), ids=list(BAD))
def test_bad_messages_bodies_are_anthropic_errors_and_leave_the_session(router_app, case):
    body, named = case
    session = router_app.new_session()
    url = session["base_url"].removesuffix("/v1") + "/v1/messages"
    httpx.post(url, json=GOOD).raise_for_status()
    before, calls = router_app.record(session["session_id"]), len(router_app.engine_log)
    message = assert_anthropic_error(httpx.post(url, json=body), 400, "invalid_request_error")
    assert named in message
    assert router_app.record(session["session_id"]) == before and len(router_app.engine_log) == calls


def test_sdk_raises_typed_errors(router_app):
    session = router_app.new_session()
    with pytest.raises(anthropic.BadRequestError, match="toolu_x"):
        client_for(session).messages.create(
            model="tiny",
            max_tokens=2,
            messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}]}],
        )
    bad = anthropic.Anthropic(base_url=router_app.url, api_key="sk-slimeish-nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}])


def test_unknown_paths_and_methods_under_messages_are_anthropic_shaped(router_app):
    session = router_app.new_session()
    base = session["base_url"].removesuffix("/v1")
    r = httpx.get(base + "/v1/messages")
    assert_anthropic_error(r, 405, "invalid_request_error")
    assert r.headers["allow"] == "POST"
    assert_anthropic_error(httpx.post(router_app.url + "/v1/messages/batches"), 404, "not_found_error")
    unknown = {"x-api-key": "sk-slimeish-nope"}
    r = httpx.post(router_app.url + "/v1/messages", json=GOOD, headers=unknown)
    assert_anthropic_error(r, 401, "authentication_error")


def gen(finish: dict) -> Generation:
    meta = {"finish_reason": finish, "output_token_logprobs": [[-0.1, 5, None]]}
    return parse_generation({"text": "x", "output_ids": [5], "meta_info": meta}, "e")


def test_stop_reasons():
    text, call = {"role": "assistant", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [{}]}
    assert stop_reason(gen({"type": "stop", "matched": 2}), text, ["END"]) == ("end_turn", None)  # eos
    assert stop_reason(gen({"type": "stop", "matched": "END"}), text, ["END"]) == ("stop_sequence", "END")
    assert stop_reason(gen({"type": "length", "length": 1}), text, []) == ("max_tokens", None)
    assert stop_reason(gen({"type": "stop", "matched": 2}), call, []) == ("tool_use", None)


def test_a_tool_result_with_is_error_reaches_the_model_as_an_error():
    """Chat formats have no field for it: the tool message's text says it (`ERROR_PREFIX`)."""
    use = {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {}}
    results = [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such file", "is_error": True},
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "3"}]},
    ]
    body = {
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "?"}, {"role": "assistant", "content": [use]}],
    }
    body["messages"].append({"role": "user", "content": results})
    converted = chat_messages(MessagesRequest.model_validate(body), lambda ref, text: True)
    assert [m["content"] for m in converted if m["role"] == "tool"] == ["Error: no such file", "3"]


def test_a_system_message_inside_messages_renders_where_it_stands_and_is_captured_exactly(router_app, renderer):
    # Claude Code 2.1's default beta puts a `role: "system"` message among `messages`
    session = router_app.new_session(group_id="g-mid-system")
    client = client_for(session)
    start = len(router_app.engine_log)
    note = {"role": "system", "content": [{"type": "text", "text": "The user prefers short answers."}]}
    messages: list[dict] = [{"role": "user", "content": "what is 1 + 2?"}]
    kw = {"model": "tiny", "system": "You add numbers.", "tools": TOOLS, "max_tokens": 6}
    r = client.messages.create(messages=messages, **kw)
    messages += [{"role": "assistant", "content": [b.model_dump() for b in r.content]}, note, answer(r.content)]
    client.messages.create(messages=messages, **kw)
    calls = engine_calls(router_app.engine_log[start:])
    prompt = renderer.tokenizer.decode(calls[-1][0]["input_ids"], skip_special_tokens=False)
    assert prompt.index("You add numbers.") < prompt.index("what is 1 + 2?") < prompt.index("short answers.")
    r = httpx.post(
        f"{router_app.url}/sessions/{session['session_id']}/finish", json={"reward": 1.0}, headers=router_app.admin
    )
    assert r.status_code == 200, r.text
    (sample,) = router_app.store.samples(session["session_id"])
    assert sample.split_reason is None
    assert_exact_capture(sample, calls, renderer)
    assert [t.segment_index for t in router_app.store.turns[session["session_id"]]] == [0, 0]
