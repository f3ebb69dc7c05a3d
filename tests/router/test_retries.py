"""Retries don't fork a trajectory: a non-streamed turn whose client went away is not recorded, and
an SDK's retry of the last answered request gets that answer again, not a second turn. Each rule
is run with each dialect's real SDK, which retries after a timeout on its own.

The engine is real; a stand-in proxy holds the first POST through it for a while, so that a client
with a shorter timeout gives up and its SDK retries: in front of the engine, the router's first
attempt is still generating when its client goes; in front of the router, the first attempt is
answered and recorded, and the answer is lost on its way to the client.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest
from fastapi import FastAPI, Request, Response

from tests.stand_in import serve_app

HOLD, TIMEOUT = 2.0, 0.7  # seconds
# not passed on: the proxy's own connection and body framing
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "content-encoding", "connection", "date", "server"}


class FirstCallHeld:
    """Forwards to `target`; holds the answer to the first POST HOLD seconds, and says when it let it go."""

    def __init__(self, target: str) -> None:
        self.target, self.calls, self.released = target, 0, threading.Event()
        self.app = FastAPI()
        self.app.add_api_route("/{path:path}", self.forward, methods=["GET", "POST"])

    async def forward(self, path: str, request: Request) -> Response:
        first = request.method == "POST" and self.calls == 0
        self.calls += request.method == "POST"
        headers = {k: v for k, v in request.headers.items() if k not in HOP_HEADERS}
        async with httpx.AsyncClient(timeout=60) as client:
            r = await client.request(
                request.method, f"{self.target}/{path}", content=await request.body(), headers=headers
            )
        if first:
            await asyncio.sleep(HOLD)
            self.released.set()
        kept = {k: v for k, v in r.headers.items() if k not in HOP_HEADERS}
        return Response(r.content, r.status_code, headers=kept)


def held_in_front_of(target: str):
    proxy = FirstCallHeld(target)
    with serve_app(proxy.app, startup_timeout=30) as url:
        yield proxy, url


@pytest.fixture
def held_engine(engine_url):
    yield from held_in_front_of(engine_url)


@pytest.fixture
def held_router(router_app):
    yield from held_in_front_of(router_app.url)


# A dialect's non-streamed turn through its SDK: (output tokens, the answer's headers).
Turn = Callable[..., tuple[int, Any]]


def chat_turn(base_url: str, **client: Any) -> tuple[int, Any]:
    sdk = openai.OpenAI(base_url=base_url, api_key="x", **client)
    raw = sdk.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    return raw.parse().usage.completion_tokens, raw.headers


def messages_turn(base_url: str, **client: Any) -> tuple[int, Any]:
    sdk = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="x", **client)
    raw = sdk.messages.with_raw_response.create(
        model="tiny", max_tokens=3, messages=[{"role": "user", "content": "hi"}]
    )
    return raw.parse().usage.output_tokens, raw.headers


def responses_turn(base_url: str, **client: Any) -> tuple[int, Any]:
    sdk = openai.OpenAI(base_url=base_url, api_key="x", **client)
    raw = sdk.responses.with_raw_response.create(model="tiny", input="hi", max_output_tokens=3)
    return raw.parse().usage.output_tokens, raw.headers


TURNS = pytest.mark.parametrize("turn", [chat_turn, messages_turn, responses_turn], ids=lambda f: f.__name__)


@TURNS
def test_a_timed_out_attempt_is_not_recorded_and_its_retry_is_the_one_turn(router_factory, held_engine, turn: Turn):
    proxy, url = held_engine
    router = router_factory([url])
    session = router.new_session()
    # the first attempt times out while it generates; the SDK's retry is answered
    output_tokens, _ = turn(session["base_url"], timeout=TIMEOUT, max_retries=1)
    assert proxy.calls == 2
    assert proxy.released.wait(10)
    time.sleep(0.3)  # the abandoned attempt finishes on the router, and is dropped
    record = router.record(session["session_id"])
    assert record["turns"] == 1 and len(record["segments"]) == 1
    (stored,) = router.store.turns[session["session_id"]]
    assert len(stored.output_ids) == output_tokens  # the turn recorded is the answer the agent got


@TURNS
def test_a_retry_of_an_answered_request_gets_the_same_answer(router_app, held_router, turn: Turn):
    proxy, url = held_router
    session = router_app.new_session()
    calls = len(router_app.engine_log)
    # the first attempt is answered and recorded, its answer held until the client gave up; the
    # SDK's retry (`x-stainless-retry-count: 1`, the same body) gets that answer, not a new turn
    output_tokens, headers = turn(session["base_url"].replace(router_app.url, url), timeout=TIMEOUT, max_retries=1)
    assert proxy.calls == 2 and headers["x-slimeish-replayed"] == "true"
    assert proxy.released.wait(10)
    assert len(router_app.engine_log) == calls + 1 and router_app.record(session["session_id"])["turns"] == 1
    (stored,) = router_app.store.turns[session["session_id"]]
    assert len(stored.output_ids) == output_tokens
    # the same request sent again by the agent itself (no retry) is a new turn: a regeneration
    _, headers = turn(session["base_url"], max_retries=0)
    assert "x-slimeish-replayed" not in headers
    record = router_app.record(session["session_id"])
    assert record["turns"] == 2 and record["segments"][1]["split_reason"] == "prompt_repeated"
