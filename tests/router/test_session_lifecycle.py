"""Session lifecycle under concurrency and store failures, against a real engine.

`slow_engine` puts a delaying proxy in front of the real engine so a turn is reliably still
generating when the test finishes its session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
import redis.exceptions
from fastapi import FastAPI, Request, Response

from slimeish.buffer import BufferInputError, ConflictError
from slimeish.router.storage import MemoryStore
from tests.router.test_errors import GOOD, assert_openai_error
from tests.stand_in import serve_app

DELAY = 1.0


@pytest.fixture(scope="module")
def slow_engine(engine_url) -> Iterator[str]:
    """The real engine behind a proxy that holds each /generate for DELAY seconds."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        if path == "generate":
            await asyncio.sleep(DELAY)
        async with httpx.AsyncClient(timeout=60) as client:
            r = await client.request(request.method, f"{engine_url}/{path}", content=await request.body())
        return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))

    with serve_app(app, startup_timeout=30) as url:
        yield url


def active_sessions(router) -> float:
    text = httpx.get(router.url + "/metrics").text
    return float(next(x for x in text.splitlines() if x.startswith("router_active_sessions ")).split()[1])


@pytest.mark.parametrize("stream", [False, True])
async def test_finish_waits_for_the_generating_turn(router_factory, slow_engine, stream):
    router = router_factory([slow_engine])
    s = router.new_session()
    finish_url = f"{router.url}/sessions/{s['session_id']}/finish"
    async with httpx.AsyncClient(timeout=30) as client:
        chat = asyncio.create_task(client.post(s["base_url"] + "/chat/completions", json={**GOOD, "stream": stream}))
        await asyncio.sleep(DELAY / 3)  # the turn is now generating
        finishes = await asyncio.gather(*(client.post(finish_url, json={}, headers=router.admin) for _ in range(2)))
        reply = await chat
    assert reply.status_code == 200, reply.text
    assert "error" not in reply.text and (not stream or "[DONE]" in reply.text)
    assert sorted(r.status_code for r in finishes) == [200, 409]  # two finishes: one wins
    done = next(r for r in finishes if r.status_code == 200).json()
    assert done["turns"] == 1 and len(router.store.turns[s["session_id"]]) == 1
    assert active_sessions(router) == 0  # decremented once
    # a new turn started while the finish waits is refused, not lost after the seal
    assert_openai_error(httpx.post(s["base_url"] + "/chat/completions", json=GOOD), 409, "session_finished")


async def test_finish_stops_waiting_after_finish_timeout(router_factory, slow_engine):
    router = router_factory([slow_engine], finish_timeout=0.1)
    s = router.new_session()
    async with httpx.AsyncClient(timeout=30) as client:
        chat = asyncio.create_task(client.post(s["base_url"] + "/chat/completions", json=GOOD))
        await asyncio.sleep(DELAY / 3)
        finish = await client.post(f"{router.url}/sessions/{s['session_id']}/finish", json={}, headers=router.admin)
        reply = await chat
    assert finish.status_code == 200 and finish.json()["turns"] == 0
    assert_openai_error(reply, 409, "session_finished")  # told plainly that the turn was not recorded
    assert router.store.turns[s["session_id"]] == []


class FlakyStore(MemoryStore):
    """A MemoryStore whose next append_turn fails once, as a Redis connection drop would."""

    fail_next = False

    async def append_turn(self, turn, epoch) -> None:
        if self.fail_next:
            self.fail_next = False
            raise redis.exceptions.ConnectionError("connection reset by peer")
        await super().append_turn(turn, epoch)


def test_a_failed_store_write_leaves_the_session_usable(router_factory, engine_url):
    store = FlakyStore()
    router = router_factory([engine_url], store=store)
    s = router.new_session()
    chat = s["base_url"] + "/chat/completions"
    first = httpx.post(chat, json=GOOD)
    first.raise_for_status()
    messages = [*GOOD["messages"], first.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
    store.fail_next = True
    error = assert_openai_error(httpx.post(chat, json={**GOOD, "messages": messages}), 503, "store_unavailable")
    assert "retry" in error["message"]
    assert router.record(s["session_id"])["turns"] == 1
    httpx.post(chat, json={**GOOD, "messages": messages}).raise_for_status()  # the retry extends turn 0
    turns = store.turns[s["session_id"]]
    assert [(t.turn_index, t.segment_index, t.split_reason) for t in turns] == [(0, 0, None), (1, 0, None)]
    assert router.record(s["session_id"])["turns"] == 2


class RefusingStore(MemoryStore):
    """A MemoryStore whose open_session raises the error a test sets."""

    error: Exception | None = None

    async def open_session(self, info) -> None:
        if self.error is not None:
            raise self.error
        await super().open_session(info)


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (BufferInputError("group size 3 differs from the group's 2"), 400, "buffer_rejected"),
        (ConflictError("group slot 0 is taken by another session"), 409, "conflict"),
        (redis.exceptions.ConnectionError("connection refused"), 503, "store_unavailable"),
        (RuntimeError("secret internals at 0xdead"), 500, "internal_error"),
    ],
)
def test_store_refusals_are_client_errors_and_leave_no_session(router_factory, error, status, code):
    store = RefusingStore()
    store.error = error
    router = router_factory([], store=store)
    r = httpx.post(router.url + "/sessions", json={"group_id": "g"}, headers=router.admin)
    body = assert_openai_error(r, status, code)
    if status < 500:
        assert body["message"] == str(error)
    elif status == 503:
        assert "retry" in body["message"]
    else:  # internals stay in the log; the client gets an id to find them
        assert "secret" not in body["message"] and "id " in body["message"]
    assert router.app.state.router.sessions.by_id == {}
    assert active_sessions(router) == 0


def test_finished_sessions_leave_the_registry_and_free_their_engine(router_factory, engine_url):
    router = router_factory([engine_url], keep_finished=1)
    state = router.app.state.router
    first, second = router.new_session(), router.new_session()
    for s in (first, second):
        httpx.post(s["base_url"] + "/chat/completions", json=GOOD).raise_for_status()
    engines = lambda: httpx.get(router.url + "/admin/engines", headers=router.admin).json()["engines"]  # noqa: E731
    assert engines()[0]["sessions"] == 2
    for s in (first, second):
        url = f"{router.url}/sessions/{s['session_id']}/finish"
        httpx.post(url, json={"reward": 1.0}, headers=router.admin).raise_for_status()
    assert engines()[0]["sessions"] == 0  # least-loaded counts open sessions, not lifetime ones
    assert state.sessions.by_id == {} and state.sessions.by_key == {}
    # the latest keep_finished summaries stay readable; older ones are gone
    assert router.record(second["session_id"])["finished"]["reward"] == 1.0
    r = httpx.get(f"{router.url}/sessions/{first['session_id']}", headers=router.admin)
    assert_openai_error(r, 404, "session_not_found")
    assert_openai_error(httpx.post(second["base_url"] + "/chat/completions", json=GOOD), 409, "session_finished")
    r = httpx.post(f"{router.url}/sessions/{second['session_id']}/finish", json={}, headers=router.admin)
    assert_openai_error(r, 409, "session_finished")


def test_a_failed_finish_write_can_be_retried(router_factory):
    class FlakyFinish(MemoryStore):
        fail_next = True

        async def finish_session(self, *args) -> None:
            if self.fail_next:
                self.fail_next = False
                raise redis.exceptions.TimeoutError("timed out")
            await super().finish_session(*args)

    router = router_factory([], store=FlakyFinish())
    s = router.new_session()
    url = f"{router.url}/sessions/{s['session_id']}/finish"
    assert_openai_error(httpx.post(url, json={"reward": 1.0}, headers=router.admin), 503, "store_unavailable")
    assert router.record(s["session_id"])["finished"] is None and active_sessions(router) == 1
    assert httpx.post(url, json={"reward": 1.0}, headers=router.admin).json()["finished"]["reward"] == 1.0
    assert active_sessions(router) == 0
