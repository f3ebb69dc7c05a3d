"""An engine that aborts a generation (`finish_reason.type == "abort"`, as SGLang's /abort_request
ends one): every dialect answers one error for it, the same streamed or not (`generation_aborted`
in OpenAI's shape, Anthropic's `overloaded_error` under /v1/messages), and records nothing.

The engine is real; a stand-in proxy in front of it rewrites every finish reason to an abort.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from tests.stand_in import serve_app


def _aborted(item: dict[str, Any]) -> dict[str, Any]:
    meta = item.get("meta_info") or {}
    if meta.get("finish_reason"):
        meta["finish_reason"] = {"type": "abort", "message": "aborted by the test"}
    return item


def aborting_proxy(target: str) -> FastAPI:
    """Forwards everything to the engine at `target`; each /generate answer ends in an abort."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        async with httpx.AsyncClient(timeout=60) as client:
            r = await client.request(request.method, f"{target}/{path}", content=await request.body())
        kind = r.headers.get("content-type", "")
        if path != "generate" or r.status_code != 200:
            return Response(r.content, r.status_code, media_type=kind)
        if not kind.startswith("text/event-stream"):
            body = r.json()
            out = [_aborted(b) for b in body] if isinstance(body, list) else _aborted(body)
            return Response(orjson.dumps(out), media_type="application/json")
        lines = []
        for line in r.text.splitlines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                line = "data: " + orjson.dumps(_aborted(orjson.loads(line[5:]))).decode()
            lines.append(line)
        return Response("\n".join(lines) + "\n", media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def aborting_engine_url(engine_url):
    with serve_app(aborting_proxy(engine_url), startup_timeout=30) as url:
        yield url


def _events(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(x[5:]) for x in text.splitlines() if x.startswith("data:") and x[5:].strip() != "[DONE]"]


def _openai_error(r: httpx.Response) -> dict[str, Any]:
    """The error's code and message, streamed (the last `data:` event) or not."""
    if r.headers["content-type"].startswith("text/event-stream"):
        error = _events(r.text)[-1]["error"]
    else:
        assert r.status_code == 503, r.text
        error = r.json()["error"]
    return {"code": error["code"], "message": error["message"]}


def _responses_error(r: httpx.Response) -> dict[str, Any]:
    """Streamed: `response.failed`, whose response carries the error."""
    if r.headers["content-type"].startswith("text/event-stream"):
        last = _events(r.text)[-1]
        assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
        return last["response"]["error"]
    return _openai_error(r)


def _anthropic_error(r: httpx.Response) -> dict[str, Any]:
    if r.headers["content-type"].startswith("text/event-stream"):
        body = _events(r.text)[-1]
    else:
        assert r.status_code == 503, r.text
        body = r.json()
    assert body["type"] == "error"
    return body["error"]


HI = [{"role": "user", "content": "hi"}]
DIALECTS: dict[str, tuple[str, dict[str, Any], Callable[[httpx.Response], dict[str, Any]]]] = {
    "chat": ("/chat/completions", {"model": "tiny", "messages": HI, "max_tokens": 4}, _openai_error),
    "completions": ("/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 4}, _openai_error),
    "responses": ("/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 4}, _responses_error),
    "messages": ("/messages", {"model": "tiny", "messages": HI, "max_tokens": 4}, _anthropic_error),
}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_engine_abort_is_one_error_streamed_or_not(router_factory, aborting_engine_url, dialect: str):
    router = router_factory([aborting_engine_url])
    session = router.new_session()
    path, body, error_of = DIALECTS[dialect]
    url = session["base_url"] + path
    plain = error_of(httpx.post(url, json=body, timeout=60))
    streamed = error_of(httpx.post(url, json={**body, "stream": True}, timeout=60))
    assert plain == streamed
    expected = "overloaded_error" if dialect == "messages" else "generation_aborted"
    assert plain.get("code", plain.get("type")) == expected
    assert router.record(session["session_id"])["turns"] == 0  # an answer nobody got is not recorded
