"""The turn endpoints dispatched ahead of FastAPI (`slimeish.router.dispatch`): matching, errors, metrics,
and the router process's start-up objects frozen out of the garbage collector."""

from __future__ import annotations

import gc
import re
from unittest import mock

import httpx
import pytest

from slimeish.router.api_v1 import completions, generate
from slimeish.router.config import RouterConfig
from slimeish.router.dialects.chat import chat_completions
from slimeish.router.dispatch import match_turn_route
from slimeish.router.native import engine_generate
from slimeish.router.server import create_app
from slimeish.router.storage import MemoryStore
from tests.router.test_errors import GOOD, assert_openai_error
from tests.stand_in import serve_app


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/chat/completions", ("/v1/chat/completions", chat_completions, None)),
        ("/v1/completions", ("/v1/completions", completions, None)),
        ("/s/sk-1/v1/chat/completions", ("/v1/chat/completions", chat_completions, "sk-1")),
        ("/s/sk-1/v1/completions", ("/v1/completions", completions, "sk-1")),
        ("/s/sk-1/generate", ("/generate", generate, "sk-1")),
        ("/generate", ("/generate", engine_generate, None)),  # SGLang's native path, uncaptured
        ("/s//generate", None),
        ("/s/sk-1", None),
        ("/s/sk-1/v1/models", None),  # FastAPI's
        ("/s/a/b/generate", None),
        ("/v1/chat/completions/", None),
        ("/sessions", None),
    ],
)
def test_match_turn_route(path, expected):
    assert match_turn_route(path) == expected


def requests_counted(url: str, endpoint: str, status: int) -> float:
    text = httpx.get(url + "/metrics").text
    found = re.search(rf'router_requests_total{{endpoint="{re.escape(endpoint)}",status="{status}"}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def test_turns_are_counted_by_endpoint_and_status(router_app):
    s = router_app.new_session()
    before = {e: requests_counted(router_app.url, e, 200) for e in ("/v1/chat/completions", "/generate")}
    httpx.post(s["base_url"] + "/chat/completions", json=GOOD).raise_for_status()
    token_in = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
    httpx.post(f"{router_app.url}/s/{s['api_key']}/generate", json=token_in).raise_for_status()
    bad_before = requests_counted(router_app.url, "/v1/chat/completions", 400)
    assert_openai_error(httpx.post(s["base_url"] + "/chat/completions", content=b"{"), 400)
    for endpoint, count in before.items():
        assert requests_counted(router_app.url, endpoint, 200) == count + 1, endpoint
    assert requests_counted(router_app.url, "/v1/chat/completions", 400) == bad_before + 1


def test_other_methods_on_a_turn_route_get_405(router_app):
    s = router_app.new_session()
    r = httpx.get(s["base_url"] + "/chat/completions")
    assert "POST" in assert_openai_error(r, 405, "method_not_allowed")["message"]
    assert router_app.record(s["session_id"])["turns"] == 0


class BrokenTurnStore(MemoryStore):
    """A MemoryStore whose turn writes fail with a bug (not a store outage, not a refusal)."""

    async def append_turn(self, turn, epoch) -> None:
        raise RuntimeError("secret internals at 0xdead")


def test_a_bug_in_a_turn_is_a_500_with_an_id_and_the_session_unchanged(router_factory, engine_url):
    router = router_factory([engine_url], store=BrokenTurnStore())
    s = router.new_session()
    r = httpx.post(s["base_url"] + "/chat/completions", json=GOOD)
    error = assert_openai_error(r, 500, "internal_error")
    assert "secret" not in error["message"] and "id " in error["message"]
    assert router.record(s["session_id"])["turns"] == 0
    assert requests_counted(router.url, "/v1/chat/completions", 500) == 1


@pytest.mark.parametrize("freeze_gc", [True, False])
def test_start_up_objects_are_frozen_only_when_asked(tiny_model, freeze_gc):
    """`slimeish router` asks (its process serves only the router); an app embedded in another
    process, like this test's, leaves that process's garbage collector alone. gc.freeze is
    replaced by a recorder: really freezing would keep this test process's objects forever."""
    with mock.patch.object(gc, "freeze") as freeze:
        app = create_app(RouterConfig(model=tiny_model, engine=[]), store=MemoryStore(), freeze_gc=freeze_gc)
        with serve_app(app, startup_timeout=30) as url:
            assert httpx.get(url + "/metrics").status_code == 200
    assert freeze.call_count == (1 if freeze_gc else 0)
