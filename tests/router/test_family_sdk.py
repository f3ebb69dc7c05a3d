"""The `openai` SDK through the router and a real engine serving each family's tiny model
(`make-tiny-model --family NAME`, renderer `auto`): a multi-turn tool episode, streamed and not,
is one segment holding exactly what the engine saw and sampled, and every answer is the family's
parse of the sampled ids. (Qwen3, whose bridge differs from its template, has test_qwen3_sdk.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from slimeish.router.config import RouterConfig
from slimeish.router.renderers.base import reply_message
from slimeish.router.renderers.select import load_renderer
from slimeish.router.server import create_app
from slimeish.router.storage import MemoryStore
from tests.router.conftest import ADMIN_TOKEN, RouterUnderTest, recording_proxy, start_engine
from tests.router.test_openai_sdk import TOOLS, assert_exact_capture
from tests.router.test_qwen3_sdk import ask, comparable, engine_turn
from tests.stand_in import serve_app

FAMILIES = ["qwen3-coder", "glm-4.5", "llama3", "deepseek-v3"]


@pytest.fixture(scope="module", params=FAMILIES)
def family_router(request, tiny_model_factory, tmp_path_factory) -> Iterator[tuple[RouterUnderTest, object]]:
    """(router -> recording proxy -> engine serving the family's tiny model, the family's renderer)."""
    model = tiny_model_factory(family=request.param)
    renderer = load_renderer(model)
    assert renderer.family == request.param  # `auto` recognised the family's template
    proc, engine = start_engine(model, tmp_path_factory.mktemp(f"{request.param}-engine"))
    log: list = []
    store = MemoryStore()
    try:
        with serve_app(recording_proxy(engine, log), startup_timeout=30) as proxy:
            config = RouterConfig(model=model, engine=[proxy], admin_token=ADMIN_TOKEN)
            with serve_app(create_app(config, store=store), startup_timeout=30) as router:
                yield RouterUnderTest(router, store, log, {"Authorization": f"Bearer {ADMIN_TOKEN}"}), renderer
    finally:
        proc.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_tool_episode_is_one_exact_segment(family_router, stream):
    router, renderer = family_router
    session = router.new_session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    start = len(router.engine_log)
    messages: list[dict] = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "1 + 2?"}]
    for turn in range(3):
        forced = {"tool_choice": {"type": "function", "function": {"name": "add"}}} if turn == 0 else {}
        reply = ask(client, messages, stream, seed=turn, **forced)
        _, out = engine_turn(router.engine_log[-1])
        opening = renderer.tool_call_opening("add")[1] if forced else ""
        finish = out["meta_info"]["finish_reason"]["type"]
        parsed = renderer.parse(opening, out["output_ids"], out["text"], finish, TOOLS)
        assert comparable(reply) == comparable(reply_message(parsed))  # the answer is the sampled ids, parsed
        if forced:  # the forced opening was sampled-from: the engine got it at the end of the prompt
            assert (
                router.engine_log[-1][0]["input_ids"][-len(renderer.tool_call_opening("add")[0]) :]
                == (renderer.tool_call_opening("add")[0])
            )
        messages.append(reply)
        results = [{"role": "tool", "tool_call_id": c["id"], "content": "3"} for c in reply.get("tool_calls") or []]
        messages += results or [{"role": "user", "content": "go on"}]
    calls = [engine_turn(e) for e in router.engine_log[start:]]
    (sample,) = router.store.samples(session["session_id"])  # one segment: no split
    assert_exact_capture(sample, calls, renderer)
