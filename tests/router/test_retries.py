"""Retries don't fork a trajectory: a non-streamed turn whose client went away is not recorded, and
an SDK's retry of the last answered request gets that answer again, not a second turn.

The engine is real; a stand-in proxy in front of it holds the first /generate for a while, so
that a client with a shorter timeout gives up and its SDK retries.
"""

from __future__ import annotations

import asyncio
import threading
import time

import anthropic
import httpx
import openai
import pytest
from fastapi import FastAPI, Request, Response

from tests.stand_in import serve_app

HOLD, TIMEOUT = 2.0, 0.7  # seconds


class FirstCallHeld:
    """Forwards to the engine; holds the first /generate HOLD seconds, and says when it let it go."""

    def __init__(self, target: str) -> None:
        self.target, self.calls, self.released = target, 0, threading.Event()
        self.app = FastAPI()
        self.app.add_api_route("/{path:path}", self.forward, methods=["GET", "POST"])

    async def forward(self, path: str, request: Request) -> Response:
        first = path == "generate" and self.calls == 0
        self.calls += path == "generate"
        async with httpx.AsyncClient(timeout=60) as client:
            r = await client.request(request.method, f"{self.target}/{path}", content=await request.body())
        if first:
            await asyncio.sleep(HOLD)
            self.released.set()
        return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))


@pytest.fixture
def held(engine_url):
    proxy = FirstCallHeld(engine_url)
    with serve_app(proxy.app, startup_timeout=30) as url:
        yield proxy, url


def chat_turn(session: dict) -> int:
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", timeout=TIMEOUT, max_retries=1)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    return r.usage.completion_tokens


def messages_turn(session: dict) -> int:
    base = session["base_url"].removesuffix("/v1")
    client = anthropic.Anthropic(base_url=base, api_key="x", timeout=TIMEOUT, max_retries=1)
    r = client.messages.create(model="tiny", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    return r.usage.output_tokens


@pytest.mark.parametrize("turn", [chat_turn, messages_turn], ids=lambda f: f.__name__)
def test_a_timed_out_attempt_is_not_recorded_and_its_retry_is_the_one_turn(router_factory, held, turn):
    proxy, url = held
    router = router_factory([url])
    session = router.new_session()
    output_tokens = turn(session)  # the first attempt times out; the SDK's retry is answered
    assert proxy.calls == 2
    assert proxy.released.wait(10)
    time.sleep(0.3)  # the abandoned attempt finishes on the router, and is dropped
    record = router.record(session["session_id"])
    assert record["turns"] == 1 and len(record["segments"]) == 1
    (stored,) = router.store.turns[session["session_id"]]
    assert len(stored.output_ids) == output_tokens  # the turn recorded is the answer the agent got


def test_a_retry_of_an_answered_request_gets_the_same_answer(router_app):
    session = router_app.new_session()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    url = session["base_url"] + "/chat/completions"
    first = httpx.post(url, json=body)
    calls = len(router_app.engine_log)
    again = httpx.post(url, json=body, headers={"x-stainless-retry-count": "1"})
    assert again.json() == first.json() and again.headers["x-slimeish-replayed"] == "true"
    assert len(router_app.engine_log) == calls and router_app.record(session["session_id"])["turns"] == 1
    # the same request sent again by the agent itself (no retry header) is a new turn: a regeneration
    httpx.post(url, json=body).raise_for_status()
    record = router_app.record(session["session_id"])
    assert record["turns"] == 2 and record["segments"][1]["split_reason"] == "prompt_repeated"
