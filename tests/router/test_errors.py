"""Bad input, isolation and auth: OpenAI-shaped 4xx errors that leave the session untouched."""

from __future__ import annotations

import re
from collections.abc import Callable

import anthropic
import httpx
import openai
import pytest

ADMIN_TOKEN = "admin-secret"  # as in conftest.py

GOOD = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code
    return error


@pytest.fixture
def session(router_app):
    """A session with one good turn, so 'unchanged' has something to compare against."""
    s = router_app.new_session()
    httpx.post(s["base_url"] + "/chat/completions", json=GOOD).raise_for_status()
    return s


BAD_BODIES = {
    "malformed json": b'{"messages": [',
    "not an object": b"[1, 2]",
    "no messages": b'{"model": "tiny"}',
    "bad role": b'{"messages": [{"role": "wizard", "content": "hi"}]}',
    "tool without id": b'{"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]}',
    "image part": b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}',
    "tool type": b'{"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "retrieval"}]}',
    "tool name": b'{"messages": [{"role": "user", "content": "a"}], '
    b'"tools": [{"type": "function", "function": {"name": "bad name!"}}]}',
    "tool params": b'{"messages": [{"role": "user", "content": "a"}], '
    b'"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}',
    "unknown tool_choice": b'{"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function", '
    b'"function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}',
    "negative max_tokens": b'{"messages": [{"role": "user", "content": "a"}], "max_tokens": -1}',
    "temperature": b'{"messages": [{"role": "user", "content": "a"}], "temperature": 9}',
}


@pytest.mark.parametrize("body", list(BAD_BODIES.values()), ids=list(BAD_BODIES))
def test_bad_chat_bodies(router_app, session, body):
    before, calls = router_app.record(session["session_id"]), len(router_app.engine_log)
    r = httpx.post(
        session["base_url"] + "/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert_openai_error(r, 400)
    assert router_app.record(session["session_id"]) == before and len(router_app.engine_log) == calls


def test_bad_message_later_in_an_episode(router_app, session):
    """Only new messages are validated on an extending turn; they still are."""
    first = httpx.post(session["base_url"] + "/chat/completions", json=GOOD).json()["choices"][0]["message"]
    before = router_app.record(session["session_id"])
    messages = [*GOOD["messages"], first, {"role": "tool", "content": "no id"}]
    r = httpx.post(session["base_url"] + "/chat/completions", json={**GOOD, "messages": messages})
    assert "messages.2" in assert_openai_error(r, 400)["param"]
    assert router_app.record(session["session_id"]) == before


def test_context_length_exceeded(router_app, session):
    before = router_app.record(session["session_id"])
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="t", messages=GOOD["messages"], max_tokens=10**6)
    assert e.value.code == "context_length_exceeded"
    # in Anthropic's words too: Claude Code reads the three numbers and retries with a max_tokens that fits
    assert re.search(r"input length and `max_tokens` exceed context limit: \d+ \+ 1000000 > \d+", e.value.message)
    long = [{"role": "user", "content": "1 " * 5000}]
    r = httpx.post(session["base_url"] + "/chat/completions", json={**GOOD, "messages": long, "max_tokens": None})
    assert_openai_error(r, 400, "context_length_exceeded")
    assert router_app.record(session["session_id"]) == before


def test_unknown_session_keys(router_app):
    r = httpx.post(router_app.url + "/s/sk-slimeish-nope/v1/chat/completions", json=GOOD)
    assert_openai_error(r, 401, "invalid_api_key")
    r = httpx.post(
        router_app.url + "/v1/chat/completions", json=GOOD, headers={"Authorization": "Bearer sk-slimeish-x"}
    )
    assert_openai_error(r, 401, "invalid_api_key")
    r = httpx.post(router_app.url + "/sessions/sess_nope/finish", json={}, headers=router_app.admin)
    assert_openai_error(r, 404, "session_not_found")


def test_finish_without_credentials_is_401_whatever_the_id(router_app, session):
    """A 404 for unknown ids only would tell an unauthenticated caller which ids exist."""
    for session_id in ("sess_nope", session["session_id"]):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {session['api_key']}x"}):
            r = httpx.post(f"{router_app.url}/sessions/{session_id}/finish", json={}, headers=headers)
            assert_openai_error(r, 401, "invalid_admin_token")
    # a session's own key for another (unknown) id is no credential for it either
    r = httpx.post(
        router_app.url + "/sessions/sess_nope/finish",
        json={},
        headers={"Authorization": f"Bearer {session['api_key']}"},
    )
    assert_openai_error(r, 401, "invalid_admin_token")
    assert router_app.record(session["session_id"])["finished"] is None


def test_anonymous_requests_are_served_but_not_logged(router_app):
    turns_before = sum(len(t) for t in router_app.store.turns.values())
    r = httpx.post(router_app.url + "/v1/chat/completions", json=GOOD, headers={"Authorization": "Bearer EMPTY"})
    assert r.status_code == 200 and r.json()["choices"]
    assert sum(len(t) for t in router_app.store.turns.values()) == turns_before


def test_sessions_are_isolated(router_app, session):
    other = router_app.new_session()
    before = router_app.record(session["session_id"])
    # another session's key cannot finish or read this one
    for headers in ({"Authorization": f"Bearer {other['api_key']}"}, {}):
        r = httpx.post(f"{router_app.url}/sessions/{session['session_id']}/finish", json={}, headers=headers)
        assert_openai_error(r, 401)
        assert_openai_error(httpx.get(f"{router_app.url}/sessions/{session['session_id']}", headers=headers), 401)
    # a turn through the other key lands in the other session only
    httpx.post(other["base_url"] + "/chat/completions", json=GOOD).raise_for_status()
    assert router_app.record(session["session_id"]) == before
    assert router_app.record(other["session_id"])["turns"] == 1
    assert other["api_key"] != session["api_key"] and len(other["api_key"]) > 40


def test_finished_session_refuses_turns(router_app, session):
    url = f"{router_app.url}/sessions/{session['session_id']}/finish"
    assert_openai_error(httpx.post(url, json={"status": "done?"}, headers=router_app.admin), 400)
    httpx.post(url, json={"reward": 0.0, "status": "truncated"}, headers=router_app.admin).raise_for_status()
    assert_openai_error(httpx.post(session["base_url"] + "/chat/completions", json=GOOD), 409, "session_finished")
    assert_openai_error(httpx.post(url, json={}, headers=router_app.admin), 409, "session_finished")
    assert router_app.store.finished[session["session_id"]][:2] == (0.0, "truncated")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/sessions"),
        ("GET", "/admin/engines"),
        ("POST", "/admin/engines"),
        ("DELETE", "/admin/engines"),
        ("POST", "/admin/pause_generation"),
        ("POST", "/admin/continue_generation"),
        ("POST", "/admin/flush_cache"),
        ("POST", "/admin/update_weights_from_disk"),
        ("POST", "/admin/update_weights_from_tensor"),
    ],
)
def test_admin_needs_the_token(router_app, method, path):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {ADMIN_TOKEN}x"}):
        assert_openai_error(httpx.request(method, router_app.url + path, json={}, headers=headers), 401)


def test_admin_engine_list_and_fan_out(router_app):
    engines = httpx.get(router_app.url + "/admin/engines", headers=router_app.admin).json()["engines"]
    assert len(engines) == 1 and engines[0]["healthy"]
    for name in ("pause_generation", "continue_generation", "flush_cache"):
        r = httpx.post(f"{router_app.url}/admin/{name}", headers=router_app.admin).json()
        assert r["ok"] and r["engines"][0]["url"] == engines[0]["url"]
    bad = httpx.post(router_app.url + "/admin/engines", json={"url": "ftp://x"}, headers=router_app.admin)
    assert_openai_error(bad, 400)
    gone = httpx.request(
        "DELETE", router_app.url + "/admin/engines", json={"url": "http://nope"}, headers=router_app.admin
    )
    assert_openai_error(gone, 404, "engine_not_found")


def test_weight_update_fans_out_and_versions_reach_the_record(router_app, session, tiny_model):
    def update(version: str) -> dict:
        body = {"model_path": str(tiny_model), "weight_version": version}
        url = router_app.url + "/admin/update_weights_from_disk"
        return httpx.post(url, json=body, headers=router_app.admin).json()

    try:
        reply = update("7")
        assert reply["ok"] and [e["weight_version"] for e in reply["engines"]] == [7]
        httpx.post(session["base_url"] + "/chat/completions", json=GOOD).raise_for_status()
        assert router_app.store.turns[session["session_id"]][-1].weight_versions == [7]
    finally:
        assert update("0")["ok"]  # the engine is shared with other tests


@pytest.mark.parametrize("bad", [[1, 2], 3, "greedy", True])
def test_token_in_sampling_params_must_be_an_object(router_app, session, bad):
    url = f"{router_app.url}/s/{session['api_key']}/generate"
    turns = router_app.record(session["session_id"])["turns"]
    r = httpx.post(url, json={"input_ids": [1, 2, 3], "sampling_params": bad})
    assert assert_openai_error(r, 400)["param"] == "sampling_params"
    assert router_app.record(session["session_id"])["turns"] == turns


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/foo"), ("GET", "/nope"), ("POST", "/v1/v1/chat/completions"), ("POST", "/s/sk-x/v1/foo")],
)
def test_unknown_paths_answer_in_the_api_shape(router_app, method, path):
    error = assert_openai_error(httpx.request(method, router_app.url + path, json={}), 404, "not_found")
    shown = path.replace("/s/sk-x/", "/s/<redacted>/")  # a session key is never repeated
    assert f"no route {method} {shown}" in error["message"] and "/v1/chat/completions" in error["message"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("POST", "/v1/models", "GET"),
        ("GET", "/sessions", "POST"),
        ("PUT", "/v1/responses", "POST"),
        ("GET", "/s/sk-x/v1/chat/completions", "POST"),
    ],
)
def test_wrong_methods_answer_in_the_api_shape(router_app, method, path, allowed):
    r = httpx.request(method, router_app.url + path, headers=router_app.admin)
    error = assert_openai_error(r, 405, "method_not_allowed")
    endpoint = path.removeprefix("/s/sk-x")  # a session's path is named without its key
    assert endpoint in error["message"] and "sk-x" not in error["message"] and method in error["message"]
    assert r.headers["allow"] == allowed and allowed in error["message"]


def test_the_openai_sdk_reads_an_unknown_path_error(router_app, session):
    """A base_url without `/v1` is the usual mistake: the SDK shows the router's message."""
    client = openai.OpenAI(base_url=session["base_url"].removesuffix("/v1"), api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="t", messages=GOOD["messages"], max_tokens=2)
    assert e.value.code == "not_found" and "/v1/chat/completions" in e.value.message


def _sdk_turns(base_url: str, key: str) -> dict[str, Callable[[], object]]:
    """One turn per dialect through its real SDK, given the session URL and a key for its header."""
    oa = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    an = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key=key, max_retries=0)  # x-api-key
    asked = [{"role": "user", "content": "hi"}]
    return {
        "chat": lambda: oa.chat.completions.create(model="tiny", messages=asked, max_tokens=2),
        "chat-stream": lambda: list(
            oa.chat.completions.create(model="tiny", messages=asked, max_tokens=2, stream=True)
        ),
        "completions": lambda: oa.completions.create(model="tiny", prompt="hi", max_tokens=2),
        "responses": lambda: oa.responses.create(model="tiny", input="hi", max_output_tokens=2),
        "messages": lambda: an.messages.create(model="tiny", messages=asked, max_tokens=2),
        "models": lambda: oa.models.list(),
        "token-in": lambda: httpx.post(
            base_url.removesuffix("/v1") + "/generate",
            json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}},
            headers={"Authorization": f"Bearer {key}"},
        ).raise_for_status(),
    }


def test_another_sessions_key_in_the_header_is_refused_in_every_dialect(router_app):
    session, other = router_app.new_session(), router_app.new_session()
    for name, turn in _sdk_turns(session["base_url"], other["api_key"]).items():
        with pytest.raises((openai.AuthenticationError, anthropic.AuthenticationError, httpx.HTTPStatusError)) as e:
            turn()
        status = e.value.response.status_code
        assert status == 401, (name, status)
    # another session's key behind a placeholder in a header read first is found too
    r = httpx.post(
        session["base_url"] + "/chat/completions",
        json={"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={"X-Session-ID": "junk", "Authorization": f"Bearer {other['api_key']}"},
    )
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert router_app.record(session["session_id"])["turns"] == 0
    assert router_app.record(other["session_id"])["turns"] == 0
    # the URL's own key, or a placeholder that is no session key, in the header is served
    for key in (session["api_key"], "x"):
        _sdk_turns(session["base_url"], key)["chat"]()
    assert router_app.record(session["session_id"])["turns"] == 2


def _gemini_turn(session_url: str) -> httpx.Response:
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 2}}
    return httpx.post(session_url + "/v1beta/models/tiny:generateContent", json=body)


def test_caller_segments_after_the_key_reach_the_session_in_every_dialect(router_app):
    """A harness's own run coordinates between the key and the API path (rLLM's `/meta/<slug>/v1`,
    NeMo-Gym's rollout prefix): the session's API, key and auth, through each dialect's real SDK."""
    session = router_app.new_session()
    base = session["base_url"].removesuffix("/v1")
    for caller in ("/runs/7/rollout/3", "/meta/rllm1:eyJydW4iOjd9/v1/x"):  # even a `v1` of the caller's
        for turn in _sdk_turns(f"{base}{caller}/v1", "x").values():
            turn()  # an SDK error fails the test, naming the dialect in its traceback
        assert _gemini_turn(base + caller).status_code == 200
        assert httpx.head(f"{base}{caller}/v1").status_code == 200  # the base URL probe
    turns = 7  # per caller: chat, its stream, completions, responses, messages, token-in, gemini (models is none)
    assert router_app.record(session["session_id"])["turns"] == 2 * turns


def test_a_wrong_key_before_caller_segments_is_refused_in_the_dialects_shape(router_app):
    session = router_app.new_session()
    wrong = session["base_url"].removesuffix("/v1") + "x/runs/7/rollout/3"
    for name, turn in _sdk_turns(wrong + "/v1", "x").items():
        with pytest.raises((openai.AuthenticationError, anthropic.AuthenticationError, httpx.HTTPStatusError)) as e:
            turn()
        assert e.value.response.status_code == 401, name
        if name == "messages":
            assert e.value.body["error"]["type"] == "authentication_error"
        elif name != "token-in":
            assert e.value.code == "invalid_api_key", name
    r = _gemini_turn(wrong)
    assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"
    assert router_app.record(session["session_id"])["turns"] == 0
