"""Bad input never stalls the router: each absurd request is refused quickly in its API's own
error shape, a `/health` sent meanwhile is answered before it (or within a generous second),
and the session is unchanged afterwards. Real SDKs where they can send the request at all."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anthropic
import httpx
import openai
import pytest

from tests.router.test_errors import GOOD, assert_openai_error

TEN_MB = "x " * 5_000_000


@pytest.fixture
def router(router_factory, engine_url):
    return router_factory([engine_url], max_body_bytes=16 * 2**20)


async def beside_health(router, bad: Callable[[], Awaitable[object]]) -> object:
    """`bad()`'s result; asserts that a `/health` sent while it runs is answered promptly."""
    async with httpx.AsyncClient(timeout=60) as client:
        task = asyncio.ensure_future(bad())
        await asyncio.sleep(0.05)  # the bad request is on its way
        sent = time.monotonic()
        health = await client.get(router.url + "/health")
        waited, bad_done = time.monotonic() - sent, task.done()
        result = await task
    assert health.status_code == 200
    # behaviour, not a benchmark: a loop blocked by the refusal would hold /health for all of it (the
    # 10 MB message's tokenization alone takes ~10 s here); 5 s leaves room for a loaded machine
    assert not bad_done or waited < 5.0, f"/health waited {waited:.1f} s"
    return result


def unchanged(router, session: dict) -> None:
    record = router.record(session["session_id"])
    assert record["turns"] == 0 and record["segments"] == [] and record["finished"] is None
    httpx.post(session["base_url"] + "/chat/completions", json=GOOD).raise_for_status()  # still usable


async def test_a_10_mb_message_is_refused_before_it_is_tokenized(router):
    s = router.new_session()
    client = openai.AsyncOpenAI(base_url=s["base_url"], api_key="x", max_retries=0)
    messages = [{"role": "user", "content": TEN_MB}]

    async def bad() -> openai.BadRequestError:
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)  # type: ignore[arg-type]
        return e.value

    started = time.monotonic()
    error = await beside_health(router, bad)
    assert time.monotonic() - started < 10  # refused, not tokenized (which alone takes ~10 s here)
    assert isinstance(error, openai.BadRequestError) and error.code == "context_length_exceeded"
    assert "maximum context length" in error.message
    unchanged(router, s)


async def test_a_10_mb_message_to_the_messages_api_gets_anthropics_error(router):
    s = router.new_session()
    client = anthropic.AsyncAnthropic(base_url=s["base_url"].removesuffix("/v1"), api_key="x", max_retries=0)

    async def bad() -> anthropic.BadRequestError:
        with pytest.raises(anthropic.BadRequestError) as e:
            await client.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": TEN_MB}])
        return e.value

    error = await beside_health(router, bad)
    assert isinstance(error, anthropic.BadRequestError)
    assert error.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "maximum context length" in error.body["error"]["message"]  # type: ignore[index]
    unchanged(router, s)


async def test_a_million_empty_messages_are_refused_before_validation(router):
    s = router.new_session()
    body = {**GOOD, "messages": [{}] * 1_000_000}
    async with httpx.AsyncClient(timeout=60) as client:
        r = await beside_health(router, lambda: client.post(s["base_url"] + "/chat/completions", json=body))
    assert isinstance(r, httpx.Response)
    error = assert_openai_error(r, 400, "too_many_messages")
    assert error["param"] == "messages" and "--max-messages" in error["message"]
    # the Responses API's `input` items count the same
    r = httpx.post(s["base_url"] + "/responses", json={"model": "tiny", "input": [{}] * 20_000}, timeout=60)
    assert_openai_error(r, 400, "too_many_messages")
    unchanged(router, s)


async def chunks(total: int) -> AsyncIterator[bytes]:
    """A body sent in chunks, with no Content-Length: counted as it arrives."""
    yield b'{"messages": [{"role": "user", "content": "'
    for _ in range(total // 2**20):
        yield b"x" * 2**20


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_over_the_limit_is_413_in_each_apis_shape(router, chunked):
    s = router.new_session()
    big = 17 * 2**20

    async def post(client: httpx.AsyncClient, path: str) -> httpx.Response:
        content = chunks(big) if chunked else b"x" * big
        return await client.post(s["base_url"] + path, content=content, headers={"content-type": "application/json"})

    async with httpx.AsyncClient(timeout=60) as client:
        r = await beside_health(router, lambda: post(client, "/chat/completions"))
        assert isinstance(r, httpx.Response)
        assert_openai_error(r, 413, "request_too_large")
        r = await post(client, "/messages")
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
        r = await client.post(router.url + "/sessions", content=b"x" * big, headers=router.admin)
        assert_openai_error(r, 413, "request_too_large")
    unchanged(router, s)


@pytest.mark.parametrize("n", [500, 0, "3"])
def test_n_is_capped_on_the_token_in_path(router, n):
    s = router.new_session()
    body = {"input_ids": [1, 2, 3], "sampling_params": {"n": n, "max_new_tokens": 2}}
    error = assert_openai_error(httpx.post(s["base_url"].removesuffix("/v1") + "/generate", json=body), 400)
    assert error["param"] == "sampling_params.n"
    assert_openai_error(httpx.post(router.url + "/generate", json=body), 400)  # the uncaptured root path too
    unchanged(router, s)
