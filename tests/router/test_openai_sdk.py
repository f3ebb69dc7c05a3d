"""The real `openai` SDK against the router and a real embedded engine.

A recording proxy between router and engine logs what the engine received and sampled; the
stored samples must equal exactly that: prompt ids followed by sampled ids, mask 1 precisely on
sampled tokens, and the engine's log-probs.
"""

from __future__ import annotations

import asyncio
import itertools

import httpx
import numpy as np
import openai
import pytest

from tests.router.conftest import chat_episode

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add two numbers",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
        },
    }
]


def client_for(session: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)


def assert_exact_capture(sample, calls, renderer):
    """`calls` are the engine's (request, response) pairs of this sample's turns, in order."""
    mask_at, prompt_len = {}, len(calls[0][0]["input_ids"])
    for request, response in calls:
        ids, out = request["input_ids"], response["output_ids"]
        assert sample.tokens[: len(ids)] == ids  # the engine got exactly the captured prefix
        assert sample.tokens[len(ids) : len(ids) + len(out)] == out  # ...and sampled exactly these
        for j, (lp, tok, _) in enumerate(response["meta_info"]["output_token_logprobs"]):
            mask_at[len(ids) + j - prompt_len] = lp
            assert tok == out[j]
    final_request, final_response = calls[-1]
    assert sample.tokens == final_request["input_ids"] + final_response["output_ids"]
    assert sample.loss_mask == [1 if i in mask_at else 0 for i in range(sample.response_length)]
    # the buffer stores log-probs as float32
    expected = np.float32([mask_at.get(i, 0.0) for i in range(sample.response_length)])
    assert np.array_equal(np.float32(sample.rollout_log_probs), expected)
    sample.validate()


def test_multi_turn_tool_episode_is_captured_exactly(router_app, renderer):
    session = router_app.new_session(group_id="g-tools", index=0, group_size=1)
    client = client_for(session)
    start = len(router_app.engine_log)
    messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "what is 1 + 2?"}]
    agent_turns = [
        {"role": "tool", "tool_call_id": "call_1", "content": '{"result": 3}'},
        {"role": "user", "content": "and 2 + 2?"},
    ]
    for turn in range(3):
        r = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=6, seed=turn)
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
        assert r.usage.completion_tokens == len(router_app.engine_log[-1][1]["output_ids"])
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        if turn < 2:
            messages.append(agent_turns[turn])
    calls = router_app.engine_log[start:]
    assert len(calls) == 3
    # each later prompt = the previous prompt + the sampled ids + only the new tail
    for (req_a, resp_a), (req_b, _) in itertools.pairwise(calls):
        assert req_b["input_ids"][: len(req_a["input_ids"]) + len(resp_a["output_ids"])] == (
            req_a["input_ids"] + resp_a["output_ids"]
        )
    # the last prompt decodes to a full render of the conversation it answered
    last_prompt = renderer.tokenizer.decode(calls[-1][0]["input_ids"], skip_special_tokens=False)
    assert last_prompt == renderer.render_text(messages[:-1], TOOLS)

    r = httpx.post(
        f"{router_app.url}/sessions/{session['session_id']}/finish", json={"reward": 1.0}, headers=router_app.admin
    )
    assert r.status_code == 200, r.text
    (sample,) = router_app.store.samples(session["session_id"])
    assert sample.reward == 1.0 and sample.split_reason is None
    assert_exact_capture(sample, calls, renderer)
    assert [t.segment_index for t in router_app.store.turns[session["session_id"]]] == [0, 0, 0]


def test_bearer_key_on_v1_and_models(router_app, tiny_model):
    session = router_app.new_session()
    client = openai.OpenAI(base_url=router_app.url + "/v1", api_key=session["api_key"], max_retries=0)
    assert [m.id for m in client.models.list().data] == [tiny_model.name]
    client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert router_app.record(session["session_id"])["turns"] == 1


def test_x_session_id_header_on_one_shared_base_url(router_app):
    """Harnesses that share one base URL among rollouts name each in `X-Session-ID`: it picks the
    session over the SDK's placeholder key, and a wrong one is refused whatever the bearer says."""
    a, b = router_app.new_session(), router_app.new_session()
    client = openai.OpenAI(base_url=router_app.url + "/v1", api_key="EMPTY", max_retries=0)
    for session in (a, b, a):
        client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            extra_headers={"X-Session-ID": session["api_key"]},
        )  # fmt: skip
    assert [router_app.record(s["session_id"])["turns"] for s in (a, b)] == [2, 1]
    r = httpx.post(
        router_app.url + "/v1/chat/completions",
        json={"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={"X-Session-ID": a["api_key"] + "x", "Authorization": f"Bearer {b['api_key']}"},
    )
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    # two headers naming two sessions: neither is guessed
    r = httpx.post(
        router_app.url + "/v1/chat/completions",
        json={"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={"X-Session-ID": a["api_key"], "Authorization": f"Bearer {b['api_key']}"},
    )
    assert r.status_code == 401 and "different sessions" in r.json()["error"]["message"]
    assert [router_app.record(s["session_id"])["turns"] for s in (a, b)] == [2, 1]


async def test_async_clients_run_concurrent_sessions(router_app):
    sessions = [router_app.new_session(group_id="g-async", index=i, group_size=4) for i in range(4)]

    await asyncio.gather(*(chat_episode(s["base_url"], ["count", "more"], max_tokens=3) for s in sessions))
    for s in sessions:
        turns = router_app.store.turns[s["session_id"]]
        assert [t.segment_index for t in turns] == [0, 0]
        assert turns[1].prompt_ids[:1] != []  # the tail only, not the whole history
        assert len(turns[1].prompt_ids) < len(turns[0].prompt_ids) + len(turns[0].output_ids)


def test_streaming_with_usage_then_an_extending_turn(router_app):
    session = router_app.new_session()
    client = client_for(session)
    messages = [{"role": "user", "content": "hi"}]
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, stream=True, stream_options={"include_usage": True},
        tools=TOOLS, logprobs=True,
    )  # fmt: skip
    chunks = list(stream)
    request, response = router_app.engine_log[-1]
    assert request["stream"] is True
    engine_chunks = response["chunks"]
    output_ids = engine_chunks[-1]["output_ids"]  # chunks are cumulative: the last holds all sampled tokens
    assert 0 < len(output_ids) <= 5
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert content == engine_chunks[-1]["text"] or calls
    streamed_lps = [
        t.logprob for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content
    ]
    assert streamed_lps == [e[0] for e in engine_chunks[-1]["meta_info"]["output_token_logprobs"]]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length", "tool_calls")
    assert chunks[-1].usage.completion_tokens == len(output_ids)
    # the message the client assembled from the stream extends the segment on the next turn
    messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "more"}]
    client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, tools=TOOLS)
    turns = router_app.store.turns[session["session_id"]]
    assert [t.segment_index for t in turns] == [0, 0] and turns[0].output_ids == output_ids
    assert router_app.engine_log[-1][0]["input_ids"][: len(request["input_ids"]) + len(output_ids)] == (
        request["input_ids"] + output_ids
    )


def test_streaming_completions(router_app):
    session = router_app.new_session()
    stream = client_for(session).completions.create(model="tiny", prompt="1 + 1 =", max_tokens=4, stream=True)
    text = "".join(c.choices[0].text for c in stream)
    assert text == router_app.engine_log[-1][1]["chunks"][-1]["text"]
    assert router_app.record(session["session_id"])["turns"] == 1


def test_logprobs_n_and_stop(router_app):
    session = router_app.new_session()
    r = client_for(session).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=4,
        n=2,
        logprobs=True,
        stop=["zzz"],
        temperature=0.8,
        top_p=0.9,
    )
    assert len(r.choices) == 2
    engine_items = router_app.engine_log[-1][1]
    assert isinstance(engine_items, list) and len(engine_items) == 2
    for choice, item in zip(r.choices, engine_items, strict=True):
        assert [t.logprob for t in choice.logprobs.content] == [
            e[0] for e in item["meta_info"]["output_token_logprobs"]
        ]
    record = router_app.record(session["session_id"])
    assert [s["split_reason"] for s in record["segments"]] == [None, "parallel_choice"]


def test_completions_text_and_tokens(router_app, renderer):
    session = router_app.new_session()
    client = client_for(session)
    r1 = client.completions.create(model="tiny", prompt="1 + 2 =", max_tokens=3, logprobs=0)
    assert len(r1.choices[0].logprobs.token_logprobs) == len(router_app.engine_log[-1][1]["output_ids"])
    client.completions.create(model="tiny", prompt="1 + 2 =" + r1.choices[0].text + " ok", max_tokens=3)
    ids = renderer.encode("5 + 5 =")
    client.completions.create(model="tiny", prompt=ids, max_tokens=2)
    record = router_app.record(session["session_id"])
    assert [s["split_reason"] for s in record["segments"]] == [None, "tokens_diverged"]


def test_token_in_generate_path(router_app, renderer):
    session = router_app.new_session()
    url = f"{router_app.url}/s/{session['api_key']}/generate"
    ids = renderer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    first = httpx.post(url, json={"input_ids": ids, "sampling_params": {"max_new_tokens": 3}}).json()
    assert {"text", "output_ids", "meta_info"} <= set(first)
    ids2 = ids + first["output_ids"] + renderer.encode("\n<|im_start|>user\nmore<|im_end|>\n")
    second = httpx.post(url, json={"input_ids": ids2, "sampling_params": {"max_new_tokens": 3}}).json()
    httpx.post(
        f"{router_app.url}/sessions/{session['session_id']}/finish",
        json={"reward": 0.5},
        headers={"Authorization": f"Bearer {session['api_key']}"},
    ).raise_for_status()
    (sample,) = router_app.store.samples(session["session_id"])
    assert sample.tokens == ids2 + second["output_ids"]
    assert sum(sample.loss_mask) == len(first["output_ids"]) + len(second["output_ids"])


@pytest.mark.parametrize("path", ["/metrics"])
def test_metrics_expose_counters(router_app, path):
    text = httpx.get(router_app.url + path).text
    for name in (
        "router_requests_total",
        "router_request_seconds",
        "router_prompt_tokens_total",
        "router_output_tokens_total",
        "router_active_sessions",
        "router_segments_total",
        "router_tool_call_parse_failures_total",
        "router_engine_healthy",
    ):
        assert name in text, name


def test_every_generate_request_the_router_sent_fits_sglangs_schema(router_app):
    """Runs after the other tests of this module: checks all the /generate bodies they caused."""
    from tests.engine.sglang_schema import validate_generate_request

    assert router_app.engine_log
    for request, _ in router_app.engine_log:
        decoded = validate_generate_request(request)
        assert decoded.return_logprob is True and decoded.input_ids == request["input_ids"]


def test_split_segments_become_separate_samples(router_app, renderer):
    """An agent that truncates its history: two samples, each exact, the second with its reason."""
    session = router_app.new_session()
    client = client_for(session)
    start = len(router_app.engine_log)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "one"}]
    for content in ("two", "three"):
        r = client.chat.completions.create(model="t", messages=messages, max_tokens=3, seed=1)
        messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": content}]
    truncated = [messages[0], *messages[3:]]  # drop the first exchange
    client.chat.completions.create(model="t", messages=truncated, max_tokens=3, seed=1)
    httpx.post(f"{router_app.url}/sessions/{session['session_id']}/finish", json={"reward": 1.0},
               headers=router_app.admin).raise_for_status()  # fmt: skip
    first, second = router_app.store.samples(session["session_id"])
    calls = router_app.engine_log[start:]
    assert (first.split_reason, second.split_reason) == (None, "history_truncated")
    assert_exact_capture(first, calls[:2], renderer)
    assert_exact_capture(second, calls[2:], renderer)
    assert second.tokens[: second.prompt_length] == renderer.full_ids(truncated, None)
    assert 'router_segments_total{reason="history_truncated"}' in httpx.get(router_app.url + "/metrics").text


def test_streaming_two_choices(router_app):
    session = router_app.new_session()
    chunks = list(
        client_for(session).chat.completions.create(
            model="t", messages=[{"role": "user", "content": "hi"}], max_tokens=3, n=2, stream=True
        )
    )
    engine_chunks = router_app.engine_log[-1][1]["chunks"]
    for i in range(2):
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
        assert text == [c for c in engine_chunks if c["index"] == i][-1]["text"]
    record = router_app.record(session["session_id"])
    assert [s["split_reason"] for s in record["segments"]] == [None, "parallel_choice"]
