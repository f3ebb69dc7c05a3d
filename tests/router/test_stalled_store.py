"""Retried writes under a stalled store: a real valkey frozen with SIGSTOP behind a real router.

A write that times out is answered 503 `store_unavailable`, and may land once the store resumes.
The same request again must then get the same result (the same session, the same finish), never
a 409 for the member the first attempt left behind, and the group must be trainable exactly
once; a turn answered 503 is never stored, even when its write lands late.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis

from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.buffer.keys import Keys
from slimeish.router.config import RouterConfig
from slimeish.router.server import create_app
from tests.router.conftest import ADMIN_TOKEN
from tests.router.test_errors import GOOD, assert_openai_error
from tests.stand_in import serve_app

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
STORE_TIMEOUT = 0.5


@pytest.fixture(scope="module")
def valkey(tmp_path_factory) -> Iterator[EmbeddedServer]:
    """A server of this module's own: the tests freeze it."""
    with EmbeddedServer(tmp_path_factory.mktemp("stalled")) as server:
        yield server


@contextlib.contextmanager
def stalled(server: EmbeddedServer) -> Iterator[None]:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


@pytest.fixture
def router(tiny_model, engine_url, valkey) -> Iterator[tuple[str, Keys]]:
    run_id = f"stall-{uuid.uuid4().hex[:8]}"
    config = RouterConfig(
        model=tiny_model,
        engine=[engine_url],
        buffer_url=valkey.url,
        run_id=run_id,
        admin_token=ADMIN_TOKEN,
        store_timeout=STORE_TIMEOUT,
    )
    with serve_app(create_app(config), startup_timeout=30) as url:
        yield url, Keys(run_id)


def eventually(read: Callable[[], object], timeout: float = 10.0) -> object:
    """`read()` once it is truthy: the late write has landed."""
    deadline = time.monotonic() + timeout
    while not (value := read()):
        assert time.monotonic() < deadline, "the write never landed"
        time.sleep(0.05)
    return value


def stored(valkey: EmbeddedServer) -> redis.Redis:
    return redis.Redis.from_url(valkey.url, decode_responses=True)


async def trainable_groups(valkey: EmbeddedServer, keys: Keys) -> list:
    """The groups a trainer takes now, acknowledged as trained."""
    async with Buffer(valkey.url, keys.run_id) as buf:
        groups = (await buf.take_groups(10, "trainer")).groups
        if groups:
            await buf.ack([g.group_id for g in groups])
        return groups


CREATE = {"group_id": "g", "index": 0, "group_size": 1}


async def test_a_retried_create_gets_the_session_its_late_write_opened(router, valkey):
    url, keys = router
    with stalled(valkey):
        assert_openai_error(httpx.post(url + "/sessions", json=CREATE, headers=ADMIN), 503, "store_unavailable")
    # The first open lands after all and holds index 0: before the fix, a retry was 409 `conflict` forever.
    ghost = eventually(lambda: stored(valkey).hget(keys.members("g"), "0"))
    retry = httpx.post(url + "/sessions", json=CREATE, headers=ADMIN)
    assert retry.status_code == 200, retry.text
    s = retry.json()
    assert s["session_id"] == ghost
    # a retry whose answer was lost (the session is open by now) gets it again
    assert httpx.post(url + "/sessions", json=CREATE, headers=ADMIN).json() == s
    # a different request for the taken place is still refused
    other = httpx.post(url + "/sessions", json={**CREATE, "metadata": {"x": 1}}, headers=ADMIN)
    assert_openai_error(other, 409, "conflict")
    httpx.post(s["base_url"] + "/chat/completions", json=GOOD).raise_for_status()
    httpx.post(f"{url}/sessions/{s['session_id']}/finish", json={"reward": 1.0}, headers=ADMIN).raise_for_status()
    groups = await trainable_groups(valkey, keys)
    assert [g.group_id for g in groups] == ["g"] and [x.reward for x in groups[0].samples] == [1.0]
    assert await trainable_groups(valkey, keys) == []  # handed out once


async def test_a_turn_answered_503_is_revoked_even_when_its_late_write_lands(router, valkey):
    url, keys = router
    s = httpx.post(url + "/sessions", json=CREATE, headers=ADMIN).json()
    chat = s["base_url"] + "/chat/completions"
    with stalled(valkey):
        assert_openai_error(httpx.post(chat, json=GOOD), 503, "store_unavailable")
    # the write sent to the frozen server may land now: the client was told it failed, so the
    # next write of the session takes it back first
    retry = httpx.post(chat, json=GOOD)  # the same request: generated anew, not a replay
    assert retry.status_code == 200 and "x-slimeish-replayed" not in retry.headers
    reply = retry.json()["choices"][0]["message"]
    more = {**GOOD, "messages": [*GOOD["messages"], reply, {"role": "user", "content": "more"}]}
    httpx.post(chat, json=more).raise_for_status()  # extends the retried turn
    finish = httpx.post(f"{url}/sessions/{s['session_id']}/finish", json={"reward": 1.0}, headers=ADMIN)
    assert finish.json()["turns"] == 2
    async with Buffer(valkey.url, keys.run_id) as buf:
        turns = await buf.turns(s["session_id"])
    assert [(t.turn_index, t.segment_index, t.split_reason) for t in turns] == [(0, 0, None), (1, 0, None)]
    [group] = await trainable_groups(valkey, keys)
    assert len(group.samples) == 1


async def test_a_turn_answered_503_before_a_finish_is_not_stored(router, valkey):
    url, keys = router
    s = httpx.post(url + "/sessions", json=CREATE, headers=ADMIN).json()
    finish = f"{url}/sessions/{s['session_id']}/finish"
    with stalled(valkey):
        assert_openai_error(httpx.post(s["base_url"] + "/chat/completions", json=GOOD), 503, "store_unavailable")
        assert_openai_error(httpx.post(finish, json={"reward": 0.5}, headers=ADMIN), 503, "store_unavailable")
    done = httpx.post(finish, json={"reward": 0.5}, headers=ADMIN)
    assert done.status_code == 200 and done.json()["turns"] == 0
    async with Buffer(valkey.url, keys.run_id) as buf:
        assert await buf.turns(s["session_id"]) == []


async def test_a_retried_finish_whose_first_write_landed_gets_the_same_answer(router, valkey):
    url, keys = router
    s = httpx.post(url + "/sessions", json=CREATE, headers=ADMIN).json()
    httpx.post(s["base_url"] + "/chat/completions", json=GOOD).raise_for_status()
    finish = f"{url}/sessions/{s['session_id']}/finish"
    with stalled(valkey):
        assert_openai_error(httpx.post(finish, json={"reward": 1.0}, headers=ADMIN), 503, "store_unavailable")
    # The finish reads the session before its write, so a stall lands none of it; this stands in
    # for the one whose write was sent just before the stall and landed after the 503.
    async with Buffer(valkey.url, keys.run_id) as buf:
        assert await buf.finish_session(s["session_id"], 1.0, "completed")
    retry = httpx.post(finish, json={"reward": 1.0}, headers=ADMIN)
    assert retry.status_code == 200 and retry.json()["finished"]["reward"] == 1.0
    assert_openai_error(httpx.post(finish, json={"reward": 1.0}, headers=ADMIN), 409, "session_finished")
    [group] = await trainable_groups(valkey, keys)
    assert [x.reward for x in group.samples] == [1.0]
    assert await trainable_groups(valkey, keys) == []
