"""The first request each agent program sends with its default configuration, as recorded from the
installed program (tests/programs/requests: long texts cut, ids zeroed), is taken by its dialect.

The recorded prompts with their output budgets exceed the tiny model's 4,096-token context, so a
request the dialect takes gets the router's own context refusal, after converting and before any
engine call; a request it refused would get a validation error naming the field. The programs themselves run against a
long-context model in tests/programs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.router.test_errors import assert_openai_error

REQUESTS = Path(__file__).resolve().parents[1] / "programs" / "requests"


def recorded(name: str) -> dict:
    return json.loads((REQUESTS / name).read_text())


@pytest.mark.parametrize(
    ("name", "path"), [("codex-0.171.0.json", "/responses"), ("opencode-1.18.33.json", "/chat/completions")]
)
def test_openai_dialect_first_request_is_taken(router_app, name, path):
    session = router_app.new_session(group_id="g-recorded")
    calls = len(router_app.engine_log)
    r = httpx.post(session["base_url"] + path, json=recorded(name))
    error = assert_openai_error(r, 400, "context_length_exceeded")
    assert int(re.search(r"the prompt has (?:at least )?(\d+)", error["message"])[1]) > 1000  # rendered in full
    assert len(router_app.engine_log) == calls


def test_claude_code_first_request_is_taken(router_app):
    session = router_app.new_session(group_id="g-recorded")
    body = recorded("claude-code-2.1.332.json")
    calls = len(router_app.engine_log)
    # count_tokens takes the same body (less max_tokens) and renders it without the engine
    counted = {k: v for k, v in body.items() if k not in ("max_tokens", "stream", "metadata")}
    r = httpx.post(session["base_url"] + "/messages/count_tokens", json=counted)
    assert r.status_code == 200, r.text
    assert r.json()["input_tokens"] > 4096
    r = httpx.post(session["base_url"] + "/messages?beta=true", json=body)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "maximum context length is 4096" in r.json()["error"]["message"]
    assert len(router_app.engine_log) == calls


def test_gemini_cli_first_request_is_taken(router_app):
    # its episode's turn (after its routing classifier's JSON side calls): the harness prompt and its
    # tools, which asks no output budget: one that does not fit beside the prompt makes it overlong
    session = router_app.new_session(group_id="g-recorded")
    body = recorded("gemini-cli-0.61.0.json")
    calls = len(router_app.engine_log)
    models = session["base_url"].removesuffix("/v1") + "/v1beta/models/gemini-3.1-pro-preview"
    r = httpx.post(f"{models}:countTokens", json={"generateContentRequest": body})
    assert r.status_code == 200, r.text
    prompt = r.json()["totalTokens"]
    assert prompt > 1000  # its system instruction and tools rendered too
    over = {**body, "generationConfig": {**body["generationConfig"], "maxOutputTokens": 4096}}
    r = httpx.post(f"{models}:streamGenerateContent?alt=sse", json=over)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and "maximum context length is 4096" in error["message"], error
    assert f"{prompt}" in error["message"]  # the same rendering as the count
    assert len(router_app.engine_log) == calls
