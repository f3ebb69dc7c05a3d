"""The real `openai` SDK's Responses API and `openai-agents` (its default, Responses model) against
the router and a real embedded engine, captured exactly as chat is (see test_openai_sdk.py)."""

from __future__ import annotations

import re

import agents
import httpx
import openai
import pytest

from slimeish.router.dialects.responses_output import CallShape, output_items
from tests.router.test_anthropic_sdk import engine_calls
from tests.router.test_errors import assert_openai_error
from tests.router.test_openai_sdk import assert_exact_capture, client_for

TOOLS = [
    {
        "type": "function",
        "name": "add",
        "description": "add two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    }
]


def answer(output: list) -> list[dict]:
    """What an agent sends after a response: each function call's output, else more text."""
    results = [
        {"type": "function_call_output", "call_id": o.call_id, "output": "3"}
        for o in output
        if o.type == "function_call"
    ]
    return results or [{"role": "user", "content": "and 2 + 2?"}]


def finish_and_check(router_app, session: dict, start: int, renderer, turns: int) -> None:
    calls = engine_calls(router_app.engine_log[start:])
    assert len(calls) == turns
    r = httpx.post(
        f"{router_app.url}/sessions/{session['session_id']}/finish", json={"reward": 1.0}, headers=router_app.admin
    )
    assert r.status_code == 200, r.text
    (sample,) = router_app.store.samples(session["session_id"])
    assert sample.split_reason is None
    assert_exact_capture(sample, calls, renderer)
    assert [t.segment_index for t in router_app.store.turns[session["session_id"]]] == [0] * turns


def test_responses_create_stream_and_previous_response_id_are_captured_exactly(router_app, renderer):
    session = router_app.new_session(group_id="g-responses")
    client = client_for(session)
    start = len(router_app.engine_log)
    items: list = [{"role": "user", "content": "what is 1 + 2?"}]
    kw = {"model": "tiny", "instructions": "You add numbers.", "tools": TOOLS, "max_output_tokens": 6}
    r = client.responses.create(input=items, tool_choice={"type": "function", "name": "add"}, **kw)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.usage.output_tokens == len(router_app.engine_log[-1][1]["output_ids"])
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    items += [o.model_dump(exclude_none=True) for o in r.output] + answer(r.output)
    with client.responses.stream(input=items, **kw) as stream:
        events = list(stream)
    # a length stop ends in `response.incomplete`, as OpenAI's does (get_final_response wants completed)
    final = events[-1].response
    assert events[-1].type == f"response.{final.status}" and final.status in ("completed", "incomplete")
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == final.output_text
    assert final.usage.output_tokens == len(router_app.engine_log[-1][1]["chunks"][-1]["output_ids"])
    # only the new items, continuing the stored response
    last = client.responses.create(input=answer(final.output), previous_response_id=final.id, **kw)
    assert last.previous_response_id == final.id
    finish_and_check(router_app, session, start, renderer, 3)


def test_openai_agents_default_model_runs_a_multi_turn_episode(router_app, renderer):
    # openai-agents treats a length stop (`incomplete`) as a failure: stop the random model early
    # on a stop string nearly every token holds (the session's defaults reach an unchanged agent)
    stops = {"stop": list("aeiou "), "max_new_tokens": 32}
    session = router_app.new_session(group_id="g-agents", sampling_defaults=stops)
    client = openai.AsyncOpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    agents.set_tracing_disabled(True)

    @agents.function_tool
    def add(a: float, b: float) -> float:
        """add two numbers"""
        return a + b

    model = agents.OpenAIProvider(openai_client=client).get_model("tiny")  # the default: Responses
    assert isinstance(model, agents.OpenAIResponsesModel)
    agent = agents.Agent(
        name="adder",
        instructions="You add numbers.",
        tools=[add],
        model=model,
    )
    start = len(router_app.engine_log)
    first = agents.Runner.run_sync(agent, "what is 1 + 2?", max_turns=3)
    second = agents.Runner.run_sync(
        agent, [*first.to_input_list(), {"role": "user", "content": "and 2 + 2?"}], max_turns=3
    )
    assert isinstance(second.final_output, str)
    turns = len(router_app.engine_log) - start
    assert turns >= 2
    finish_and_check(router_app, session, start, renderer, turns)


GOOD = {"model": "tiny", "input": "hi", "max_output_tokens": 2}
BAD = {
    "unknown previous_response_id": ({**GOOD, "previous_response_id": "resp_nope"}, "resp_nope"),
    "item type": ({**GOOD, "input": [{"type": "computer_call_output", "call_id": "c"}]}, "input.0"),
    "image part": (
        {**GOOD, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input.0",
    ),
    "output without its call": (
        {**GOOD, "input": [{"type": "function_call_output", "call_id": "call_9", "output": "3"}]},
        "call_9",
    ),
    "unknown tool_choice": ({**GOOD, "tools": TOOLS, "tool_choice": {"type": "function", "name": "mul"}}, "mul"),
    "max_output_tokens": ({**GOOD, "max_output_tokens": 0}, "max_output_tokens"),
}


@pytest.mark.parametrize("case", list(BAD.values()), ids=list(BAD))
def test_bad_responses_bodies_are_openai_errors_and_leave_the_session(router_app, case):
    body, named = case
    session = router_app.new_session()
    url = session["base_url"] + "/responses"
    httpx.post(url, json=GOOD).raise_for_status()
    before, calls = router_app.record(session["session_id"]), len(router_app.engine_log)
    error = assert_openai_error(httpx.post(url, json=body), 400)
    assert named in error["message"]
    assert router_app.record(session["session_id"]) == before and len(router_app.engine_log) == calls


def test_store_false_is_not_kept(router_app):
    client = client_for(router_app.new_session())
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.BadRequestError, match=r.id):
        client.responses.create(model="tiny", input="more", max_output_tokens=2, previous_response_id=r.id)


def test_retrieve_returns_the_stored_response_and_404_for_others(router_app):
    session = router_app.new_session()
    client = client_for(session)
    kw = {"model": "tiny", "input": "hi", "max_output_tokens": 2}
    created = client.responses.create(**kw)
    with client.responses.stream(**kw) as stream:
        streamed = list(stream)[-1].response  # completed or incomplete: the final response object
    for answered in (created, streamed):
        # a completed stream's final object is the SDK's `ParsedResponse` (with `parsed: None` in
        # its text parts), an incomplete one's a `Response`: compared by their fields' values
        assert client.responses.retrieve(answered.id).model_dump(exclude_none=True) == answered.model_dump(
            exclude_none=True
        )
    # the key in a header, at the root path, reaches the same session's responses
    by_header = httpx.get(
        f"{router_app.url}/v1/responses/{created.id}", headers={"Authorization": f"Bearer {session['api_key']}"}
    )
    assert by_header.status_code == 200 and by_header.json()["id"] == created.id
    unstored = client.responses.create(**kw, store=False)
    for missing in ("resp_nope", unstored.id):
        with pytest.raises(openai.NotFoundError) as e:
            client.responses.retrieve(missing)
        assert missing in assert_openai_error(e.value.response, 404)["message"]
    other = client_for(router_app.new_session())  # another session's key does not see them
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(created.id)


# Codex CLI's default tools (the shapes of the `openai` SDK's `NamespaceTool` and `WebSearchTool`):
# its multi-agent functions in a namespace, and OpenAI's hosted web search.
SPAWN = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
CODEX_TOOLS = [
    *TOOLS,
    {
        "type": "namespace",
        "name": "multi_agent",
        "description": "Tools to run sub-agents.",
        "tools": [{"type": "function", "name": "spawn_agent", "description": "start a sub-agent", "parameters": SPAWN}],
    },
    {"type": "web_search", "external_web_access": False},
]


def test_codex_namespace_and_web_search_tools_are_served_and_captured_exactly(router_app, renderer):
    session = router_app.new_session(group_id="g-codex")
    client = client_for(session)
    start = len(router_app.engine_log)
    call = {
        "type": "function_call",
        "call_id": "call_spawn",
        "namespace": "multi_agent",
        "name": "spawn_agent",
        "arguments": '{"message": "hi"}',
    }
    items: list = [{"role": "user", "content": "spawn one"}, call]
    items.append({"type": "function_call_output", "call_id": "call_spawn", "output": "spawned"})
    kw = {"model": "tiny", "instructions": "You code.", "tools": CODEX_TOOLS, "max_output_tokens": 6}
    first = client.responses.create(input=items, **kw)
    items += [o.model_dump(exclude_none=True) for o in first.output] + answer(first.output)
    with client.responses.stream(input=items, **kw) as stream:
        list(stream)
    # the model sees the namespace's function under its flat name, its call too, and no web search
    spawn = {"name": "multi_agent__spawn_agent", "description": "start a sub-agent", "parameters": SPAWN}
    add = {k: v for k, v in TOOLS[0].items() if k != "type"}
    chat_tools = [{"type": "function", "function": f} for f in (add, spawn)]
    first_prompt = renderer.tokenizer.decode(router_app.engine_log[start][0]["input_ids"], skip_special_tokens=False)
    flat_call = {**call, "name": "multi_agent__spawn_agent"}
    messages = [
        {"role": "system", "content": "You code."},
        {"role": "user", "content": "spawn one"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_spawn",
                    "type": "function",
                    "function": {"name": flat_call["name"], "arguments": call["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_spawn", "content": "spawned"},
    ]
    assert first_prompt.startswith(renderer.render_text(messages, chat_tools))
    assert "web_search" not in first_prompt
    finish_and_check(router_app, session, start, renderer, 2)


def test_a_call_to_a_namespaced_function_is_answered_under_its_namespace():
    call = {"id": "call_1", "type": "function", "function": {"name": "multi_agent__spawn_agent", "arguments": "{}"}}
    other = {"id": "call_2", "type": "function", "function": {"name": "mcp__fs__read", "arguments": "{}"}}
    reply = {"role": "assistant", "content": None, "tool_calls": [call, other]}
    shapes = {"multi_agent__spawn_agent": CallShape("spawn_agent", "multi_agent")}
    items = output_items(reply, lambda text: "ref", shapes)
    assert [(i.get("namespace"), i["name"]) for i in items] == [("multi_agent", "spawn_agent"), (None, "mcp__fs__read")]
    # the `openai` SDK reads the item back with its namespace
    parsed = openai.types.responses.ResponseFunctionToolCall.model_validate(items[0])
    assert (parsed.namespace, parsed.name) == ("multi_agent", "spawn_agent")


def test_a_call_to_a_freeform_tool_is_answered_as_a_custom_tool_call():
    call = {"id": "call_1", "type": "function", "function": {"name": "functions__exec", "arguments": '{"input": "ls"}'}}
    reply = {"role": "assistant", "content": None, "tool_calls": [call]}
    (item,) = output_items(reply, lambda text: "ref", {"functions__exec": CallShape("exec", "functions", custom=True)})
    assert (item["type"], item["namespace"], item["name"], item["input"]) == (
        "custom_tool_call",
        "functions",
        "exec",
        "ls",
    )
    parsed = openai.types.responses.ResponseCustomToolCall.model_validate(item)
    assert parsed.input == "ls"


# Codex 0.171's tools: in an `additional_tools` input item, its shell a freeform tool in a namespace
EXEC = {
    "type": "custom",
    "name": "exec",
    "description": "run code",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
}
CODEX_ITEMS = [
    {
        "type": "additional_tools",
        "role": "developer",
        "tools": [{"type": "namespace", "name": "functions", "description": "", "tools": [EXEC]}],
    },
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You code."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
    {"type": "configuration_update", "reasoning": {"effort": "low"}},
]


def test_codex_item_tools_and_freeform_calls_are_rendered(router_app, renderer):
    session = router_app.new_session(group_id="g-codex-exec")
    client = client_for(session)
    start = len(router_app.engine_log)
    kw = {"model": "tiny", "max_output_tokens": 6, "store": False}
    first = client.responses.create(input=CODEX_ITEMS, **kw)
    prompt = renderer.tokenizer.decode(router_app.engine_log[start][0]["input_ids"], skip_special_tokens=False)
    assert "functions__exec" in prompt and "lark grammar" in prompt  # one string argument, its grammar said
    # what Codex sends back after the model called exec: the call and its output, by item
    call = {"type": "custom_tool_call", "call_id": "call_x", "namespace": "functions", "name": "exec", "input": "ls"}
    output = {"type": "custom_tool_call_output", "call_id": "call_x", "output": "a.txt"}
    items = [*CODEX_ITEMS, *(o.model_dump(exclude_none=True) for o in first.output), call, output]
    client.responses.create(input=items, **kw)
    second = renderer.tokenizer.decode(router_app.engine_log[-1][0]["input_ids"], skip_special_tokens=False)
    # the call as the model would have sampled it (its one string argument), then its output
    assert re.search(r'functions__exec.*"input": ?"ls".*a\.txt', second, re.S)
