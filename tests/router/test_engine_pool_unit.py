"""EnginePool placement, ejection, retries and re-admission.

`httpx.MockTransport` replaces the engines' HTTP servers here, so that each failure mode (refused
connection, 5xx, 4xx, health flapping) can be produced on demand; real engines are covered in
test_engine_pool.py.
"""

from __future__ import annotations

import httpx
import pytest

from router.engine_pool import EngineError, EnginePool, EngineRejected, NoEngineError

OK = {"text": "", "output_ids": [1], "meta_info": {"weight_version": "4", "output_token_logprobs": [[-1.0, 1, None]]}}


def pool_with(behaviour: dict[str, str]) -> tuple[EnginePool, list[str]]:
    """Engines a, b, c; `behaviour[host]` is "ok", "down" (connection refused), "reset" (closed before
    answering), "slow" (read timeout), "500" or "400"."""
    calls: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        calls.append(f"{host}{request.url.path}")
        mode = behaviour.get(host, "ok")
        if mode == "down":
            raise httpx.ConnectError("refused", request=request)
        if mode == "reset":
            raise httpx.RemoteProtocolError("server disconnected without sending a response", request=request)
        if mode == "slow":
            raise httpx.ReadTimeout("timed out", request=request)
        if mode in ("500", "400"):
            return httpx.Response(int(mode), text="nope")
        return httpx.Response(200, json=OK if request.url.path == "/generate" else {})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    return EnginePool(client, ["http://a", "http://b", "http://c"], timeout=5), calls


async def test_sticky_then_least_loaded():
    pool, _ = pool_with({})
    pool.engines["http://a"].inflight = 3
    pool.engines["http://b"].sessions = 1
    assert pool.pick(None).url == "http://c"
    assert pool.pick("http://a").url == "http://a"  # sticky while healthy, even if busier
    pool.engines["http://a"].healthy = False
    assert pool.pick("http://a").url == "http://c"


@pytest.mark.parametrize("failure", ["down", "reset"])
async def test_unreachable_engine_is_ejected_and_the_request_retried(failure):
    pool, calls = pool_with({"a": failure})
    data, engine = await pool.generate({"input_ids": [1]}, sticky="http://a")
    assert engine.url != "http://a" and data == OK and engine.weight_version == "4"
    assert calls[0] == "a/generate" and not pool.engines["http://a"].healthy
    assert all(e.inflight == 0 for e in pool.engines.values())


@pytest.mark.parametrize(("failure", "status"), [("500", 502), ("slow", 504)])
@pytest.mark.parametrize("stream", [False, True])
async def test_an_error_answer_fails_only_that_request(failure, status, stream):
    """A poison request (5xx) or a long generation (read timeout) must not empty the pool."""
    pool, calls = pool_with({"a": failure, "b": failure, "c": failure})
    for _ in range(3):
        with pytest.raises(EngineError) as e:
            if stream:
                [c async for c in pool.stream({"input_ids": [1]}, sticky=None)]
            else:
                await pool.generate({"input_ids": [1]}, sticky=None)
        assert e.value.status == status
    assert len(calls) == 3  # never retried on another engine
    assert all(e.healthy and e.inflight == 0 for e in pool.engines.values())


async def test_retries_are_capped():
    pool, calls = pool_with({"a": "down", "b": "down", "c": "down"})
    pool.engines["http://d"] = type(pool.engines["http://a"])("http://d")
    pool.retries = 1
    with pytest.raises(NoEngineError, match="could be reached"):
        await pool.generate({"input_ids": [1]}, sticky=None)
    assert len(calls) == 2 and sum(e.healthy for e in pool.engines.values()) == 2


async def test_bad_request_is_not_retried():
    pool, calls = pool_with({"a": "400"})
    with pytest.raises(EngineRejected):
        await pool.generate({"input_ids": [1]}, sticky="http://a")
    assert calls == ["a/generate"] and pool.engines["http://a"].healthy


async def test_no_engine_left():
    pool, _ = pool_with({"a": "down", "b": "down", "c": "down"})
    with pytest.raises(NoEngineError):
        await pool.generate({"input_ids": [1]}, sticky=None)


async def test_health_checks_eject_and_readmit():
    behaviour = {"b": "down"}
    pool, _ = pool_with(behaviour)
    await pool.check_health()
    assert [e.healthy for e in pool.engines.values()] == [True, False, True]
    behaviour["b"] = "ok"
    await pool.check_health()
    assert pool.engines["http://b"].healthy


async def test_broadcast_reports_each_engine():
    pool, _ = pool_with({"c": "down"})
    results = await pool.broadcast("/flush_cache", None)
    assert [(r["url"], r["ok"]) for r in results] == [("http://a", True), ("http://b", True), ("http://c", False)]
