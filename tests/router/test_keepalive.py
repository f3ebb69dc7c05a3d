"""Liveness: while a turn generates, each dialect's stream sends an event its client decodes every
`--stream-keepalive` seconds, so a client with an idle watchdog keeps a long generation.

The engine is real; a stand-in proxy between router and engine holds its stream for a while after
the first chunk (a long generation, in wall time). The client is each real SDK with a read timeout
shorter than that hold: it completes with keep-alive events and times out without them.

Through the prefill too: with a long prompt on the real engine and an interval far shorter than
its prefill, the stream opens before the first token and its first keep-alive comes right after
the dialect's opening events, before anything sampled; the real SDKs still parse those streams.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import anthropic
import httpx
import httpx2
import openai
import orjson
import pytest
from google import genai
from google.genai import types

from tests.router.conftest import stream_tampering_proxy
from tests.stand_in import serve_app

HOLD, WATCHDOG, KEEPALIVE = 1.5, 0.6, 0.2  # seconds


async def held(rest: list[bytes]) -> AsyncIterator[bytes]:
    """A streamed /generate pauses HOLD seconds after its first chunk."""
    await asyncio.sleep(HOLD)
    for event in rest:
        yield event


def chat(session: dict) -> str:
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0, timeout=WATCHDOG)
    chunks = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    )
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def messages(session: dict) -> str:
    base = session["base_url"].removesuffix("/v1")
    client = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0, timeout=WATCHDOG)
    with client.messages.stream(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}]) as s:
        return "".join(s.text_stream)


def responses(session: dict) -> str:
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0, timeout=WATCHDOG)
    with client.responses.stream(model="tiny", input="hi", max_output_tokens=4) as s:
        return "".join(e.delta for e in s if e.type == "response.output_text.delta")


# the anthropic SDK runs on httpx2, whose timeouts are its own
TIMEOUTS = (httpx.TimeoutException, httpx2.TimeoutException, openai.APITimeoutError, anthropic.APITimeoutError)


@pytest.fixture(scope="module")
def slow_engine_url(engine_url):
    with serve_app(stream_tampering_proxy(engine_url, held), startup_timeout=30) as url:
        yield url


@pytest.mark.parametrize("consume", [chat, messages, responses], ids=lambda f: f.__name__)
def test_a_watchdog_client_keeps_a_long_generation(router_factory, slow_engine_url, consume):
    router = router_factory([slow_engine_url], stream_keepalive=KEEPALIVE)
    session = router.new_session()
    text = consume(session)
    assert isinstance(text, str)
    assert router.record(session["session_id"])["turns"] == 1


@pytest.mark.parametrize("consume", [chat, messages, responses], ids=lambda f: f.__name__)
def test_without_keepalive_the_same_client_gives_up(router_factory, slow_engine_url, consume):
    router = router_factory([slow_engine_url], stream_keepalive=0)
    with pytest.raises(TIMEOUTS):
        consume(router.new_session())


def test_keepalive_events_are_the_dialects_own(router_factory, slow_engine_url):
    router = router_factory([slow_engine_url], stream_keepalive=KEEPALIVE)
    base = router.new_session()["base_url"]
    body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    r = httpx.post(base.removesuffix("/v1") + "/v1/messages", json=body, timeout=30)
    assert b'event: ping\ndata: {"type":"ping"}' in r.content
    r = httpx.post(base + "/responses", json={"input": "hi", "max_output_tokens": 4, "stream": True}, timeout=30)
    assert r.content.count(b"event: response.in_progress") >= 2  # the opening one, then keep-alives
    r = httpx.post(base + "/chat/completions", json={**body, "stream": True}, timeout=30)
    assert b'"delta":{}}]}' in r.content


# -- through the prefill ---------------------------------------------------------------------------
def long_prompt() -> str:
    """A prefill of thousands of tokens, far longer than PREFILL_KEEPALIVE; its unique start keeps
    it out of the engine's prefix cache (which would skip the prefill)."""
    return uuid.uuid4().hex + " " + " ".join(["word"] * 1500)


PREFILL_KEEPALIVE = 0.001  # seconds


def _events(raw: bytes) -> list[tuple[str | None, dict]]:
    """(event name, data) of each SSE event."""
    out = []
    for block in raw.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines and lines["data"] != "[DONE]":
            out.append((lines.get("event"), orjson.loads(lines["data"])))
    return out


def _raw(base: str, dialect: str) -> bytes:
    long = long_prompt()
    root, asked = base.removesuffix("/v1"), [{"role": "user", "content": long}]
    requests = {
        "chat": (base + "/chat/completions", {"messages": asked, "max_tokens": 4}),
        "messages": (root + "/v1/messages", {"model": "tiny", "messages": asked, "max_tokens": 4}),
        "responses": (base + "/responses", {"input": long, "max_output_tokens": 4}),
    }
    if dialect == "gemini":
        body = {"contents": [{"role": "user", "parts": [{"text": long}]}], "generationConfig": {"maxOutputTokens": 4}}
        r = httpx.post(root + "/v1beta/models/tiny:streamGenerateContent", params={"alt": "sse"}, json=body, timeout=60)
    else:
        url, body = requests[dialect]
        r = httpx.post(url, json={**body, "stream": True}, timeout=60)
    assert r.status_code == 200, r.text
    return r.content


# (how many opening events the dialect sends before waiting on the engine, its keep-alive)
OPENING = {
    "chat": (1, lambda e: e[1]["choices"] == [{"index": 0, "delta": {}}]),
    "messages": (1, lambda e: e[0] == "ping"),
    "responses": (2, lambda e: e[0] == "response.in_progress"),
    "gemini": (0, lambda e: e[1]["candidates"][0]["content"]["parts"] == [{"text": ""}]),
}


@pytest.mark.parametrize("dialect", OPENING)
def test_a_long_prefill_hears_a_keepalive_before_the_first_token(router_factory, engine_url, dialect):
    router = router_factory([engine_url], stream_keepalive=PREFILL_KEEPALIVE)
    events = _events(_raw(router.new_session()["base_url"], dialect))
    opening, is_keepalive = OPENING[dialect]
    assert is_keepalive(events[opening]), events[: opening + 1]  # right after the opening: before any token


def _chat_long(session: dict) -> str:
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    asked = [{"role": "user", "content": long_prompt()}]
    chunks = client.chat.completions.create(model="tiny", messages=asked, max_tokens=4, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _messages_long(session: dict) -> str:
    client = anthropic.Anthropic(base_url=session["base_url"].removesuffix("/v1"), api_key="x", max_retries=0)
    with client.messages.stream(model="tiny", max_tokens=4, messages=[{"role": "user", "content": long_prompt()}]) as s:
        final = s.get_final_message()
    return "".join(b.text for b in final.content if b.type == "text")


def _responses_long(session: dict) -> str:
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    with client.responses.stream(model="tiny", input=long_prompt(), max_output_tokens=4) as s:
        return "".join(e.delta for e in s if e.type == "response.output_text.delta")  # 4 tokens: incomplete


def _gemini_long(session: dict) -> str:
    base = session["base_url"].removesuffix("/v1")
    client = genai.Client(api_key=session["api_key"], http_options=types.HttpOptions(base_url=base))
    config = types.GenerateContentConfig(max_output_tokens=4)
    return "".join(
        c.text or "" for c in client.models.generate_content_stream(model="tiny", contents=long_prompt(), config=config)
    )


@pytest.mark.parametrize(
    "consume", [_chat_long, _messages_long, _responses_long, _gemini_long], ids=lambda f: f.__name__
)
def test_the_sdks_parse_a_stream_with_prefill_keepalives(router_factory, engine_url, consume):
    router = router_factory([engine_url], stream_keepalive=PREFILL_KEEPALIVE)
    session = router.new_session()
    text = consume(session)
    turns = router.store.turns[session["session_id"]]
    assert len(turns) == 1 and isinstance(text, str)
