"""Liveness: while a turn generates, each dialect's stream sends an event its client decodes every
`--stream-keepalive` seconds, so a client with an idle watchdog keeps a long generation.

The engine is real; a stand-in proxy between router and engine holds its stream for a while after
the first chunk (a long generation, in wall time). The client is each real SDK with a read timeout
shorter than that hold: it completes with keep-alive events and times out without them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anthropic
import httpx
import httpx2
import openai
import pytest

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
