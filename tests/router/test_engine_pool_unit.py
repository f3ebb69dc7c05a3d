"""EnginePool placement, ejection, retries and re-admission.

Three real loopback HTTP servers (aiohttp.web) stand in for engines a, b and c; each one's
behaviour is switched on demand, so every failure mode is a real one: a closed port (refused),
a connection closed before the answer, an answer slower than the timeout, 5xx and 4xx. Real
engines are covered in test_engine_pool.py.
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
from aiohttp import web

from slimeish.common.procs import free_port
from slimeish.router.engine_http import IDLE_CONNECTION_S, EngineError, EngineRejected
from slimeish.router.engine_pool import EnginePool, NoEngineError
from slimeish.router.engines import refused_by_all

OK = {"text": "", "output_ids": [1], "meta_info": {"weight_version": "4", "output_token_logprobs": [[-1.0, 1, None]]}}
TIMEOUT = 0.5


class Engines:
    """Engines a, b, c; `await set(name, mode)` with mode "ok", "down" (nothing listens: refused),
    "reset" (the connection is closed before an answer), "reset-once" (that, then "ok"), "slow"
    (answers after the timeout),
    "500" or "400". `calls` lists the requests that reached a server, as "<name><path>"."""

    def __init__(self) -> None:
        self.modes: dict[str, str] = {}
        self.calls: list[str] = []
        self.ports = {name: free_port() for name in "abc"}
        self.runners: dict[str, web.AppRunner] = {}

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    async def set(self, name: str, mode: str) -> None:
        self.modes[name] = mode
        if mode == "down" and name in self.runners:
            await self.runners.pop(name).cleanup()
        elif mode != "down" and name not in self.runners:
            app = web.Application()
            app.router.add_route("*", "/{path:.*}", lambda request, name=name: self.handle(name, request))
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.ports[name]).start()
            self.runners[name] = runner

    async def handle(self, name: str, request: web.Request) -> web.StreamResponse:
        self.calls.append(f"{name}{request.path}")
        mode = self.modes[name]
        if mode in ("reset", "reset-once"):
            if mode == "reset-once":
                self.modes[name] = "ok"
            request.transport.close()
            return web.Response()
        if mode == "slow":
            await asyncio.sleep(TIMEOUT * 4)
        if mode in ("500", "400"):
            return web.Response(status=int(mode), text="nope")
        return web.json_response(OK if request.path == "/generate" else {})

    async def close(self) -> None:
        for runner in self.runners.values():
            await runner.cleanup()


@pytest.fixture
async def engines():
    engines = Engines()
    for name in "abc":
        await engines.set(name, "ok")
    yield engines
    await engines.close()


@pytest.fixture
async def pool(engines):
    async with aiohttp.ClientSession() as client:
        pool = EnginePool(client, [engines.url(n) for n in "abc"], timeout=TIMEOUT, check_timeout=TIMEOUT)
        yield pool
        pool.close()


async def test_sticky_then_least_loaded(engines, pool):
    a, b, c = (engines.url(n) for n in "abc")
    pool.engines[a].inflight = 3
    pool.engines[b].sessions = 1
    assert pool.pick(None).url == c
    assert pool.pick(a).url == a  # sticky while healthy, even if busier
    pool.engines[a].healthy = False
    assert pool.pick(a).url == c


@pytest.mark.parametrize("failure", ["down", "reset"])
async def test_unreachable_engine_is_ejected_and_the_request_retried(engines, pool, failure):
    await engines.set("a", failure)
    data, engine = await pool.generate({"input_ids": [1]}, sticky=engines.url("a"))
    assert engine.url != engines.url("a") and data == OK and engine.weight_version == 4
    assert not pool.engines[engines.url("a")].healthy
    # A dropped connection is tried once more on the same engine before it is ejected.
    assert engines.calls[-1].endswith("/generate") and len(engines.calls) == (3 if failure == "reset" else 1)
    assert all(e.inflight == 0 for e in pool.engines.values())


async def test_a_connection_dropped_once_is_retried_on_the_same_engine(engines, pool):
    """What a kept-alive connection closing under a request looks like: the engine is fine."""
    await engines.set("a", "reset-once")
    data, engine = await pool.generate({"input_ids": [1]}, sticky=engines.url("a"))
    assert engine.url == engines.url("a") and data == OK and engine.healthy
    assert engines.calls == ["a/generate", "a/generate"]


async def test_a_stream_whose_connection_dropped_once_is_retried_on_the_same_engine(engines, pool):
    async def reset_then_sse(name: str, request: web.Request) -> web.StreamResponse:
        engines.calls.append(name)
        if len(engines.calls) == 1:
            request.transport.close()
            return web.Response()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"i": 0}\n\ndata: [DONE]\n\n')
        return response

    engines.handle = reset_then_sse
    chunks = [(chunk, engine.url) async for chunk, engine in pool.stream({"input_ids": [1]}, sticky=engines.url("a"))]
    assert chunks == [({"i": 0}, engines.url("a"))] and engines.calls == ["a", "a"]
    assert pool.engines[engines.url("a")].healthy


@pytest.mark.parametrize(("failure", "status"), [("500", 502), ("slow", 504)])
@pytest.mark.parametrize("stream", [False, True])
async def test_an_error_answer_fails_only_that_request(engines, pool, failure, status, stream):
    """A poison request (5xx) or a long generation (read timeout) must not empty the pool."""
    for name in "abc":
        await engines.set(name, failure)
    for _ in range(3):
        with pytest.raises(EngineError) as e:
            if stream:
                [c async for c in pool.stream({"input_ids": [1]}, sticky=None)]
            else:
                await pool.generate({"input_ids": [1]}, sticky=None)
        assert e.value.status == status
    assert len(engines.calls) == 3  # never retried on another engine
    assert all(e.healthy and e.inflight == 0 for e in pool.engines.values())


async def test_streamed_chunks_arrive_in_order(engines, pool):
    async def sse(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for i in range(3):
            await response.write(f'data: {{"i": {i}}}\n\n'.encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    engines.handle = lambda name, request: sse(request)
    chunks = [chunk async for chunk, _ in pool.stream({"input_ids": [1]}, sticky=engines.url("b"))]
    assert chunks == [{"i": 0}, {"i": 1}, {"i": 2}]


async def test_a_stream_line_longer_than_aiohttps_line_limit_arrives_whole(engines, pool):
    """SGLang's chunks are cumulative: a long generation's last lines are megabytes."""
    big = {"output_ids": list(range(200_000))}  # ~1.3 MB of JSON on one line

    async def sse(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        payload = b"data: " + orjson.dumps(big) + b"\n\n"
        for i in range(0, len(payload), 65_536):  # in pieces, as a network delivers it
            await response.write(payload[i : i + 65_536])
        await response.write(b"data: [DONE]\n\n")
        return response

    engines.handle = lambda name, request: sse(request)
    assert [chunk async for chunk, _ in pool.stream({"input_ids": [1]}, sticky=None)] == [big]


async def test_an_answer_cut_short_fails_only_that_request(engines, pool):
    """The engine read the request and died mid-answer: a 502, not retried (it may have run)."""

    async def cut(name: str, request: web.Request) -> web.StreamResponse:
        engines.calls.append(name)
        response = web.StreamResponse(headers={"content-type": "application/json"})
        response.content_length = 100
        await response.prepare(request)
        await response.write(b'{"text": "')
        request.transport.close()
        return response

    engines.handle = cut
    with pytest.raises(EngineError) as e:
        await pool.generate({"input_ids": [1]}, sticky=engines.url("a"))
    assert e.value.status == 502 and engines.calls == ["a"] and pool.engines[engines.url("a")].healthy


async def test_a_connection_the_engine_closes_is_not_reused(engines, pool):
    ports: list[int] = []

    async def close_after(name: str, request: web.Request) -> web.Response:
        ports.append(request.transport.get_extra_info("peername")[1])
        return web.json_response(OK, headers={"connection": "close"})

    engines.handle = close_after
    for _ in range(2):
        assert (await pool.generate({"input_ids": [1]}, sticky=engines.url("a")))[0] == OK
    assert len(set(ports)) == 2 and pool.engines[engines.url("a")].healthy


async def test_retries_are_capped(engines, pool):
    for name in "abc":
        await engines.set(name, "down")
    pool.retries = 1
    with pytest.raises(NoEngineError, match="could be reached"):
        await pool.generate({"input_ids": [1]}, sticky=None)
    assert sum(e.healthy for e in pool.engines.values()) == 1  # two tried and ejected, one never tried


async def test_bad_request_is_not_retried(engines, pool):
    await engines.set("a", "400")
    with pytest.raises(EngineRejected, match="nope"):
        await pool.generate({"input_ids": [1]}, sticky=engines.url("a"))
    assert engines.calls == ["a/generate"] and pool.engines[engines.url("a")].healthy


async def test_no_engine_left(engines, pool):
    for name in "abc":
        await engines.set(name, "down")
    with pytest.raises(NoEngineError):
        await pool.generate({"input_ids": [1]}, sticky=None)


async def test_health_checks_eject_and_readmit(engines, pool):
    await engines.set("b", "down")
    await pool.check_health()
    assert [e.healthy for e in pool.engines.values()] == [True, False, True]
    await engines.set("b", "ok")
    await pool.check_health()
    assert pool.engines[engines.url("b")].healthy


async def test_a_slow_health_check_ejects_only_after_the_threshold(engines, pool):
    """An engine that takes the connection but answers /health late (a long prefill on a busy CPU)
    stays in the pool for `failure_threshold - 1` checks and comes back with its first answer."""
    await engines.set("b", "slow")
    b = pool.engines[engines.url("b")]
    for _ in range(pool.failure_threshold - 1):
        await pool.check_health()
        assert b.healthy
    await pool.check_health()
    assert not b.healthy and b.failed_checks == pool.failure_threshold
    await engines.set("b", "ok")
    await pool.check_health()
    assert b.healthy and b.failed_checks == 0
    await engines.set("b", "500")
    await pool.check_health()
    assert b.healthy  # one failed answer is tolerated too


async def test_fan_out_skips_engines_that_are_down_and_ejects_those_that_fail(engines, pool):
    """A weight sync's calls go to the engines that are up: one found down or failing the call is
    skipped and ejected (the health check brings it back), and the others are not held up."""
    await engines.set("b", "500")
    await engines.set("c", "down")
    results = await pool.fan_out("/flush_cache", None)
    assert [(r["ok"], r.get("skipped")) for r in results] == [
        (True, None), (False, "failed /flush_cache"), (False, "failed /flush_cache")
    ]  # fmt: skip
    assert [e.healthy for e in pool.engines.values()] == [True, False, False]
    assert not refused_by_all(results)
    results = await pool.fan_out("/flush_cache", None)
    assert [r.get("skipped") for r in results] == [None, "unhealthy", "unhealthy"]
    assert engines.calls.count("b/flush_cache") == 1  # an ejected engine is not called again


async def test_an_update_every_engine_refuses_is_an_error_and_not_replayed(engines, pool):
    for name in "abc":
        await engines.set(name, "500")
    results = await pool.fan_out("/update_weights_from_disk", {"model_path": "/nowhere", "weight_version": "3"})
    assert refused_by_all(results) and not pool.updates


async def test_idle_connections_are_dropped_before_sglang_closes_them():
    """SGLang closes a connection idle for 5 s; the router must not reuse one that old, or a turn
    races the close, fails, and ejects a healthy engine. Idle limit shortened here to keep the test
    fast; the default is checked against SGLang's 5 s."""
    assert IDLE_CONNECTION_S < 5.0
    client_ports: list[int] = []

    async def handle(request: web.Request) -> web.Response:
        client_ports.append(request.transport.get_extra_info("peername")[1])
        return web.json_response(OK)

    app = web.Application()
    app.router.add_post("/generate", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as client:
            pool = EnginePool(client, [f"http://127.0.0.1:{port}"], timeout=TIMEOUT, idle_s=0.3)
            for pause in (0.0, 0.1, 0.6):
                await asyncio.sleep(pause)
                await pool.generate({"input_ids": [1]}, None)
            pool.close()
    finally:
        await runner.cleanup()
    first, reused, after_idle = client_ports
    assert reused == first, "a connection idle for less than the limit is kept"
    assert after_idle != first, "a connection idle for longer than the limit is not reused"
