"""Agent programs probe their base URL before the first request (Claude Code sends `HEAD`): the
router's base URLs and a session's answer 200, and a session's tells an unknown or finished key."""

from __future__ import annotations

import httpx
import pytest

BASES = ["", "/v1", "/v1beta"]


@pytest.mark.parametrize("method", ["HEAD", "GET"])
@pytest.mark.parametrize("base", BASES, ids=lambda b: b or "/")
def test_a_base_url_answers_200(router_app, method, base):
    session = router_app.new_session()
    session_base = session["base_url"].removesuffix("/v1") + base
    for url in (router_app.url + (base or "/"), session_base):
        r = httpx.request(method, url)
        assert r.status_code == 200, (url, r.text)


def test_a_session_base_url_tells_an_unknown_or_finished_key(router_app):
    r = httpx.get(router_app.url + "/s/sk-slimeish-nope/v1")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    session = router_app.new_session()
    finish = f"{router_app.url}/sessions/{session['session_id']}/finish"
    httpx.post(finish, json={"reward": 0}, headers=router_app.admin)
    assert httpx.head(session["base_url"]).status_code == 409
