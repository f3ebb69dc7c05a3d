"""Reasoning in Chat Completions (`reasoning_content`, streamed as reasoning deltas), Responses
(`reasoning` items) and Messages (`thinking` blocks), with the real `openai` and `anthropic` SDKs,
streamed and not, through the router and a real engine.

The engine serves `reasoning_model`: the tiny Qwen3-family model with weights set so that it
writes `<think>sum</think>add` after a generation prompt, and `{}}` closing the call after the
opening that forces `add` (whose reasoning is empty: no item, no block). These tests prove that
the reasoning the model sampled reaches the agent where each API puts it (with the router's
reference, `encrypted_content` and `signature`, where the API has one); that an agent returning
its history with that reasoning, or without it, keeps the episode one segment holding exactly
what the engine saw and sampled; and that reasoning under a reference the router did not give
splits as an edit.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from slimeish.router.config import RouterConfig
from slimeish.router.renderers.select import load_renderer
from slimeish.router.server import create_app
from slimeish.router.storage import MemoryStore
from tests.router import test_anthropic_sdk as A
from tests.router import test_responses_sdk as O
from tests.router.conftest import ADMIN_TOKEN, RouterUnderTest, recording_proxy, start_engine
from tests.router.reasoning_model import CONTENT, REASONING, reasoning_model
from tests.router.test_anthropic_sdk import engine_calls
from tests.router.test_openai_sdk import assert_exact_capture
from tests.router.test_qwen3_sdk import ask, comparable
from tests.stand_in import serve_app


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return reasoning_model(tmp_path_factory.mktemp("reasoning-model"))


@pytest.fixture(scope="module")
def router(model, tmp_path_factory) -> Iterator[RouterUnderTest]:
    proc, engine = start_engine(model, tmp_path_factory.mktemp("reasoning-engine"))
    log: list = []
    store = MemoryStore()
    try:
        with serve_app(recording_proxy(engine, log), startup_timeout=30) as proxy:
            config = RouterConfig(model=model, engine=[proxy], admin_token=ADMIN_TOKEN)
            with serve_app(create_app(config, store=store), startup_timeout=30) as url:
                yield RouterUnderTest(url, store, log, {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    finally:
        proc.stop()


def one_exact_segment(router: RouterUnderTest, model, session: dict, start: int, turns: int) -> None:
    calls = engine_calls(router.engine_log[start:])
    assert len(calls) == turns
    (sample,) = router.store.samples(session["session_id"])  # one segment: no split
    assert_exact_capture(sample, calls, load_renderer(model))


# -- Chat Completions -----------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
@pytest.mark.parametrize("echo", [True, False], ids=["with-reasoning", "without-reasoning"])
def test_chat_reasoning_content_and_one_exact_segment(router, model, stream, echo):
    session = router.new_session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    start = len(router.engine_log)
    messages: list[dict] = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "1 + 2?"}]
    for turn in range(4):
        forced = {"tool_choice": {"type": "function", "function": {"name": "add"}}} if turn % 2 == 0 else {}
        reply = ask(client, messages, stream, **forced)  # streamed: assembled from the deltas
        content, reasoning, calls = comparable(reply)
        if forced:  # the forced call: parsed, with empty reasoning (no reasoning_content)
            assert (content or None, reasoning, calls) == (None, None, [("add", {})])
        else:  # the reasoning the model sampled, out of `content`
            assert (content, reasoning, calls) == (CONTENT, REASONING, [])
        if not echo:
            reply.pop("reasoning_content", None)
        messages.append(reply)
        results = [{"role": "tool", "tool_call_id": c["id"], "content": "3"} for c in reply.get("tool_calls") or []]
        messages += results or [{"role": "user", "content": "go on"}]
    one_exact_segment(router, model, session, start, 4)


# -- Responses ------------------------------------------------------------------------------------
def respond(client: openai.OpenAI, items: list, stream: bool, forced: bool, **extra):
    kw = {"model": "tiny", "instructions": "You add numbers.", "tools": O.TOOLS, "max_output_tokens": 16, **extra}
    if forced:
        kw["tool_choice"] = {"type": "function", "name": "add"}
    if not stream:
        return client.responses.create(input=items, **kw)
    with client.responses.stream(input=items, **kw) as events:
        seen = list(events)
    final = events.get_final_response()
    deltas = "".join(e.delta for e in seen if e.type == "response.reasoning_text.delta")
    assert deltas == "".join(c.text for o in final.output if o.type == "reasoning" for c in o.content or [])
    return final


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
@pytest.mark.parametrize("echo", [True, False], ids=["with-reasoning", "without-reasoning"])
def test_responses_reasoning_items_and_one_exact_segment(router, model, stream, echo):
    session = router.new_session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    start, items = len(router.engine_log), [{"role": "user", "content": "1 + 2?"}]
    for turn in range(4):
        r = respond(client, items, stream, forced=turn % 2 == 0)
        output = [o.model_dump(exclude_none=True) for o in r.output]
        if turn % 2 == 0:  # the forced call: its reasoning is empty, so no reasoning item
            assert [o["type"] for o in output] == ["function_call"]
        else:
            reasoning, _ = output
            assert reasoning["type"] == "reasoning" and reasoning["content"] == [
                {"type": "reasoning_text", "text": REASONING}
            ]
            assert reasoning["summary"] == [] and reasoning["encrypted_content"]
            assert r.output_text == CONTENT
        items += [o for o in output if echo or o["type"] != "reasoning"] + O.answer(r.output)
    one_exact_segment(router, model, session, start, 4)


def test_responses_reasoning_under_a_foreign_reference_is_an_edit(router):
    session = router.new_session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    items: list = [{"role": "user", "content": "1 + 2?"}]
    r = respond(client, items, False, forced=False)
    reasoning = r.output[0].model_dump(exclude_none=True)
    forged = {**reasoning, "encrypted_content": reasoning["encrypted_content"][:-2] + "xx"}
    rest = [o.model_dump(exclude_none=True) for o in r.output[1:]]
    respond(client, [*items, forged, *rest, {"role": "user", "content": "go on"}], False, forced=False)
    turns = router.store.turns[session["session_id"]]
    assert [(t.segment_index, t.split_reason) for t in turns] == [(0, None), (1, "assistant_edited")]


def test_responses_stored_reasoning_continues_with_previous_response_id(router, model):
    session = router.new_session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    start = len(router.engine_log)
    first = respond(client, [{"role": "user", "content": "1 + 2?"}], True, forced=False)
    assert first.output[0].type == "reasoning"
    respond(client, [{"role": "user", "content": "go on"}], False, forced=False, previous_response_id=first.id)
    one_exact_segment(router, model, session, start, 2)


# -- Messages -------------------------------------------------------------------------------------
def message(client: anthropic.Anthropic, messages: list, stream: bool, forced: bool):
    kw = {"model": "tiny", "system": "You add numbers.", "tools": A.TOOLS, "max_tokens": 16}
    if forced:
        kw["tool_choice"] = {"type": "tool", "name": "add"}
    if not stream:
        return client.messages.create(messages=messages, **kw)
    with client.messages.stream(messages=messages, **kw) as events:
        thinking = "".join(e.thinking for e in events if e.type == "thinking")
        final = events.get_final_message()
    assert thinking == "".join(b.thinking for b in final.content if b.type == "thinking")
    return final


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
@pytest.mark.parametrize("echo", [True, False], ids=["with-thinking", "without-thinking"])
def test_messages_thinking_blocks_and_one_exact_segment(router, model, stream, echo):
    session = router.new_session()
    client = A.client_for(session)
    start, messages = len(router.engine_log), [{"role": "user", "content": "1 + 2?"}]
    for turn in range(4):
        r = message(client, messages, stream, forced=turn % 2 == 0)
        blocks = [b.model_dump() for b in r.content]
        if turn % 2 == 0:  # the forced call: its reasoning is empty, so no thinking block
            assert [b["type"] for b in blocks] == ["tool_use"] and r.stop_reason == "tool_use"
        else:
            thinking, text = blocks
            assert thinking["type"] == "thinking" and thinking["thinking"] == REASONING and thinking["signature"]
            assert text == {"type": "text", "text": CONTENT, "citations": None} and r.stop_reason == "end_turn"
        kept = [b for b in blocks if echo or b["type"] != "thinking"]
        messages += [{"role": "assistant", "content": kept}, A.answer(r.content)]
    one_exact_segment(router, model, session, start, 4)


@pytest.mark.parametrize(
    "returned",
    [
        lambda b: {**b, "signature": b["signature"][:-2] + "xx"},
        lambda b: {**b, "thinking": "something else"},
        lambda b: {"type": "redacted_thinking", "data": "opaque"},
    ],
    ids=["forged-signature", "edited-thinking", "redacted"],
)
def test_messages_thinking_the_router_did_not_give_is_an_edit(router, returned):
    session = router.new_session()
    client = A.client_for(session)
    messages: list = [{"role": "user", "content": "1 + 2?"}]
    r = message(client, messages, False, forced=False)
    thinking, *rest = [b.model_dump(exclude_none=True) for b in r.content]
    messages += [{"role": "assistant", "content": [returned(thinking), *rest]}, {"role": "user", "content": "go on"}]
    message(client, messages, False, forced=False)
    turns = router.store.turns[session["session_id"]]
    assert [(t.segment_index, t.split_reason) for t in turns] == [(0, None), (1, "assistant_edited")]
