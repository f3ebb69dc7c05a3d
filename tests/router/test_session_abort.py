"""`POST /sessions/{id}/abort`: an episode lost to its infrastructure is sealed as aborted in the
router and gives its group place back in the buffer, for the rollout side to generate it again."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.router.config import RouterConfig
from slimeish.router.server import create_app
from tests.router.conftest import ADMIN_TOKEN
from tests.router.test_errors import GOOD, assert_openai_error
from tests.router.test_session_lifecycle import DELAY, active_sessions, slow_engine  # noqa: F401 (a fixture)
from tests.stand_in import serve_app

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def abort(router_url: str, session_id: str, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{router_url}/sessions/{session_id}/abort", headers=ADMIN if headers is None else headers)


def test_an_aborted_session_is_sealed_and_answers_as_finished(router_factory, engine_url):
    router = router_factory([engine_url])
    s = router.new_session()
    httpx.post(s["base_url"] + "/chat/completions", json=GOOD).raise_for_status()
    r = abort(router.url, s["session_id"])
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["finished"] == {"reward": None, "status": "aborted", "metadata": {}} and body["place_freed"]
    assert router.store.finished[s["session_id"]][1] == "aborted"
    assert active_sessions(router) == 0
    engines = httpx.get(router.url + "/admin/engines", headers=ADMIN).json()["engines"]
    assert engines[0]["sessions"] == 0  # its engine is released
    assert_openai_error(httpx.post(s["base_url"] + "/chat/completions", json=GOOD), 409, "session_finished")
    assert_openai_error(abort(router.url, s["session_id"]), 409, "session_finished")  # a second abort
    finish = httpx.post(f"{router.url}/sessions/{s['session_id']}/finish", json={}, headers=ADMIN)
    assert_openai_error(finish, 409, "session_finished")
    assert router.record(s["session_id"])["finished"]["status"] == "aborted"


def test_abort_is_authorised_as_finish_is(router_factory):
    router = router_factory([])
    s = router.new_session()
    assert_openai_error(abort(router.url, "sess_unknown"), 404, "session_not_found")
    assert_openai_error(abort(router.url, "sess_unknown", {}), 401, "invalid_admin_token")  # no id oracle
    assert_openai_error(abort(router.url, s["session_id"], {"Authorization": "Bearer wrong"}), 401)
    own_key = {"Authorization": f"Bearer {s['api_key']}"}
    assert abort(router.url, s["session_id"], own_key).json()["finished"]["status"] == "aborted"


async def test_abort_does_not_wait_for_a_generating_turn_which_is_then_refused(router_factory, slow_engine):  # noqa: F811
    router = router_factory([slow_engine])
    s = router.new_session()
    async with httpx.AsyncClient(timeout=30) as client:
        chat = asyncio.create_task(client.post(s["base_url"] + "/chat/completions", json=GOOD))
        await asyncio.sleep(DELAY / 3)  # the turn is now generating
        started = time.monotonic()
        r = await client.post(f"{router.url}/sessions/{s['session_id']}/abort", headers=ADMIN)
        assert r.status_code == 200 and time.monotonic() - started < DELAY / 2
        reply = await chat
    assert_openai_error(reply, 409, "session_finished")  # not recorded into the aborted session
    assert router.store.turns[s["session_id"]] == []


@pytest.fixture(scope="module")
def valkey(tmp_path_factory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("abort")) as server:
        yield server


async def test_the_aborted_place_is_opened_again_and_the_group_trains_with_the_new_member(
    tiny_model, engine_url, valkey
):
    run_id = f"abort-{uuid.uuid4().hex[:8]}"
    config = RouterConfig(
        model=tiny_model, engine=[engine_url], buffer_url=valkey.url, run_id=run_id, admin_token=ADMIN_TOKEN
    )
    with serve_app(create_app(config), startup_timeout=30) as url:
        async with httpx.AsyncClient(timeout=60, headers=ADMIN) as client:

            async def member(index: int) -> dict:
                r = await client.post(url + "/sessions", json={"group_id": "g", "index": index, "group_size": 2})
                s = r.raise_for_status().json()
                (await client.post(s["base_url"] + "/chat/completions", json=GOOD)).raise_for_status()
                return s

            lost, kept = await member(0), await member(1)
            (await client.post(f"{url}/sessions/{kept['session_id']}/finish", json={"reward": 1.0})).raise_for_status()
            r = await client.post(f"{url}/sessions/{lost['session_id']}/abort")
            assert r.status_code == 200 and r.json()["place_freed"], r.text
            again = await member(0)  # the same place of the same group
            (await client.post(f"{url}/sessions/{again['session_id']}/finish", json={"reward": 0.5})).raise_for_status()
    async with Buffer(valkey.url, run_id) as buf:
        (group,) = (await buf.take_groups(1, "t")).groups
        assert [(s.session_id, s.reward) for s in group.samples] == [
            (again["session_id"], 0.5),
            (kept["session_id"], 1.0),
        ]
        lost_view = await buf.session(lost["session_id"])
        assert lost_view is not None and lost_view.status == "aborted" and lost_view.retired
