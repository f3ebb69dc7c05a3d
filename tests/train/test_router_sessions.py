"""The one session-ending client (`slimeish.rollout.router_sessions`), against two loopback apps
that stand in for routers' session API: each call goes to the router that holds the session,
rides out 503s, gives up at once when the run stops, and counts only the sessions it opened; the
producer finishes what a rollout left open for it through it (with a real valkey-server)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from slimeish.buffer import Buffer, SessionInfo
from slimeish.common.sample import Sample, Status
from slimeish.rollout import RECORD_FROM_RETURN
from slimeish.rollout.router_sessions import RouterSessions, RouterUnavailable, SessionRef
from slimeish.train.producer import store_uncaptured
from tests.stand_in import serve_app


class RouterStandIn:
    """Answers `unavailable` 503s, then 200; records (method, path, authorization) of each request."""

    def __init__(self, unavailable: int = 0):
        self.unavailable = unavailable
        self.seen: list[tuple[str, str, str | None]] = []
        self.app = FastAPI()
        self.app.add_api_route("/{path:path}", self.answer, methods=["GET", "POST"])

    async def answer(self, path: str, request: Request) -> JSONResponse:
        self.seen.append((request.method, "/" + path, request.headers.get("authorization")))
        if self.unavailable:
            self.unavailable -= 1
            return JSONResponse({"detail": "buffer down"}, status_code=503)
        if path == "sessions":
            return JSONResponse({"session_id": f"s{len(self.seen)}", "api_key": "k", "base_url": "http://x/s/k/v1"})
        if path.startswith("sessions/lost"):
            return JSONResponse({"detail": "unknown session"}, status_code=404)
        return JSONResponse({"session_id": path.split("/")[1], "samples": 1})


@pytest.fixture
def routers() -> Iterator[tuple[RouterStandIn, str, RouterStandIn, str]]:
    a, b = RouterStandIn(), RouterStandIn()
    with serve_app(a.app) as url_a, serve_app(b.app) as url_b:
        yield a, url_a, b, url_b


def client_for(urls: list[str], stopping: threading.Event | None = None, first: int = 0) -> RouterSessions:
    return RouterSessions(
        urls, "admin", httpx.AsyncClient(), retry_s=30, stopping=stopping or threading.Event(), first=first
    )


async def test_a_session_is_finished_on_its_own_router_through_503s(routers):
    a, url_a, b, url_b = routers
    b.unavailable = 2
    sessions = client_for([url_a, url_b])
    summary = await sessions.finish(SessionRef("s7", url_b), 1.0, Status.COMPLETED)
    await sessions.client.aclose()
    assert summary == {"session_id": "s7", "samples": 1}
    assert a.seen == [] and b.seen == [("POST", "/sessions/s7/finish", "Bearer admin")] * 3


async def test_a_session_a_restarted_router_lost_is_none(routers):
    _, url_a, _, _ = routers
    sessions = client_for([url_a])
    assert await sessions.finish(SessionRef("lost", url_a), 1.0, Status.COMPLETED) is None
    await sessions.client.aclose()


async def test_a_stopping_run_gives_up_at_once(routers):
    a, url_a, _, _ = routers
    a.unavailable = 1000
    stopping = threading.Event()
    sessions = client_for([url_a], stopping)
    asyncio.get_running_loop().call_later(0.5, stopping.set)
    started = time.monotonic()
    with pytest.raises(RouterUnavailable):
        await sessions.finish(SessionRef("s1", url_a), 1.0, Status.COMPLETED)
    await sessions.client.aclose()
    assert time.monotonic() - started < 10  # retry_s is 30


async def test_only_the_sessions_it_opened_count_toward_its_balance(routers):
    _, url_a, _, url_b = routers
    sessions = client_for([url_a, url_b], first=1)  # starts with b among equals
    opened = [await sessions.open("g", i, 2, {}) for i in range(2)]
    assert [s.router_url for s in opened] == [url_b, url_a]
    await sessions.finish(SessionRef("elsewhere", url_a), 1.0, Status.COMPLETED)  # another object opened it
    assert sessions.open_on == {url_b: 1, url_a: 1}
    await sessions.finish(opened[0], 1.0, Status.COMPLETED)
    assert sessions.open_on == {url_b: 0, url_a: 1}
    await sessions.client.aclose()


async def test_the_producer_records_a_left_open_session_and_finishes_it_on_its_router(routers, valkey):
    a, url_a, b, url_b = routers
    b.unavailable = 1  # the router holding it is restarting: the finish waits for it
    sample = Sample(
        tokens=[1, 2, 3], response_length=1, loss_mask=[1], rollout_log_probs=[-0.5], weight_versions=[0], reward=1.0
    )
    sample.session_id, sample.status = "left-open", Status.COMPLETED
    sample.metadata[RECORD_FROM_RETURN] = url_b
    args = SimpleNamespace(loss_type="policy_loss")
    sessions = client_for([url_a, url_b])
    async with Buffer(valkey.url, "producer-finish") as buffer:
        await buffer.open_session(SessionInfo("left-open", "g0", 0, 1))
        await store_uncaptured(buffer, [[sample]], args, lambda: sessions)
        (turn,) = await buffer.turns("left-open")
    await sessions.client.aclose()
    assert (turn.prompt_ids, turn.output_ids) == ([1, 2], [3])
    assert a.seen == [] and b.seen == [("POST", "/sessions/left-open/finish", "Bearer admin")] * 2
    assert RECORD_FROM_RETURN not in sample.metadata
