"""An engine that fails mid-stream: each dialect's stream ends with its API's error event, which
its real SDK decodes, and the turn is not recorded (the session goes on as if it never ran).

Responses ends with `response.failed` (the response, `status: "failed"`, its `error`), not an
`error` event: a failure after the first byte is always one of a response already announced by
`response.created`, which is what `response.failed` reports; OpenAI's `error` event is for
errors no response carries, and a failure before any output is an HTTP error here.

The engine is real; a stand-in proxy in front of it breaks every streamed /generate after its
first chunk (the connection dropped, as when an engine dies), and forwards anything else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import anthropic
import httpx
import openai
import pytest
from openai.types.responses import ResponseFailedEvent

from tests.router.conftest import stream_tampering_proxy
from tests.stand_in import serve_app


class EngineDied(RuntimeError):
    """Raised in the stand-in's stream body: the server drops the connection mid-body."""


async def dies(rest: list[bytes]) -> AsyncIterator[bytes]:
    raise EngineDied("the engine died mid-stream")
    yield b""  # an async generator that ends the stream with the error


@pytest.fixture(scope="module")
def dying_engine_url(engine_url):
    with serve_app(stream_tampering_proxy(engine_url, dies), startup_timeout=30) as url:
        yield url


def chat(session: dict) -> str:
    """The openai SDK raises the error chunk (`{"error": {...}}`) as an `APIError`."""
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    chunks = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
    )
    with pytest.raises(openai.APIError) as e:
        list(chunks)
    return e.value.message


def messages(session: dict) -> str:
    """The anthropic SDK raises the `error` event as an `APIStatusError` of its body."""
    client = anthropic.Anthropic(base_url=session["base_url"].removesuffix("/v1"), api_key="x", max_retries=0)
    asked = [{"role": "user", "content": "hi"}]
    with (
        pytest.raises(anthropic.APIStatusError) as e,
        client.messages.stream(model="tiny", max_tokens=8, messages=asked) as s,
    ):
        list(s)
    assert e.value.body["error"]["type"] == "api_error"
    return e.value.body["error"]["message"]


def responses(session: dict) -> str:
    """The openai SDK decodes `response.failed` as a `ResponseFailedEvent`, the last event; its
    stream helper then has no final response."""
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    with client.responses.stream(model="tiny", input="hi", max_output_tokens=8) as s:
        events = list(s)
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            s.get_final_response()
    failed = events[-1]
    assert isinstance(failed, ResponseFailedEvent) and [e.type for e in events][:2] == [
        "response.created",
        "response.in_progress",
    ]
    assert failed.response.id == events[0].response.id and failed.response.status == "failed"
    assert failed.response.error.code == "engine_failed"
    return failed.response.error.message


@pytest.mark.parametrize("consume", [chat, messages, responses], ids=lambda f: f.__name__)
def test_an_engine_failing_mid_stream_ends_the_stream_with_the_apis_error(
    router_factory, dying_engine_url, consume: Callable[[dict], str]
):
    router = router_factory([dying_engine_url])
    session = router.new_session()
    assert "failed mid-stream" in consume(session)
    assert router.record(session["session_id"])["turns"] == 0  # nothing the agent did not get is recorded
    # the session goes on: a non-streamed turn is answered and is its first
    r = httpx.post(
        session["base_url"] + "/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert r.status_code == 200, r.text
    record = router.record(session["session_id"])
    assert record["turns"] == 1 and len(record["segments"]) == 1
