"""The engine pool keeps a version per LoRA adapter: several runs share the engines, each syncing its
own adapter, so an engine that comes back without them is given each one's last load again.

A loopback HTTP server stands in for the embedded engine's adapter endpoints (its /model_info reports
`lora_weight_versions` as the engine's does; test_lora_shared_engine.py runs the real engine), so a
restart that loses every adapter is one assignment.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest
from aiohttp import web

from slimeish.common.procs import free_port
from slimeish.router.engine_pool import EnginePool
from slimeish.router.engines import Engine, note_answer_version


class AdapterEngine:
    """Serves /health, /model_info and SGLang's adapter endpoints; `loads` lists each load it took."""

    def __init__(self) -> None:
        self.versions: dict[str, int] = {}
        self.loads: list[tuple[str, int]] = []
        self.busy: set[str] = set()  # adapters whose unload is refused
        self.gate: asyncio.Event | None = None  # when set: each load waits for it to open
        self.loading = asyncio.Event()  # a load waits at the gate
        self.unloaded = asyncio.Event()  # an unload reached the engine
        self.port = free_port()
        app = web.Application()
        app.router.add_get("/health", lambda _: web.Response())
        app.router.add_get("/model_info", self.model_info)
        app.router.add_post("/load_lora_adapter", self.load)
        app.router.add_post("/unload_lora_adapter", self.unload)
        self.runner = web.AppRunner(app)

    async def model_info(self, _: web.Request) -> web.Response:
        adapters = {name: str(v) for name, v in self.versions.items()}
        return web.json_response({"weight_version": "0", "lora_weight_versions": adapters})

    async def load(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.gate is not None:
            self.loading.set()
            await self.gate.wait()
        self.versions[body["lora_name"]] = int(body["weight_version"])
        self.loads.append((body["lora_name"], int(body["weight_version"])))
        return web.json_response({"success": True})

    async def unload(self, request: web.Request) -> web.Response:
        name = (await request.json())["lora_name"]
        if name in self.busy:  # the embedded engine's answer while requests use the adapter
            return web.json_response({"success": False, "message": f"{name} is in use by 1 requests"}, status=400)
        self.unloaded.set()
        if self.versions.pop(name, None) is None:
            return web.json_response({"success": False, "message": f"no LoRA adapter named {name!r}"}, status=400)
        return web.json_response({"success": True})


@pytest.fixture
async def engine():
    engine = AdapterEngine()
    await engine.runner.setup()
    await web.TCPSite(engine.runner, "127.0.0.1", engine.port).start()
    yield engine
    await engine.runner.cleanup()


def _load(name: str, version: int) -> dict[str, object]:
    return {"lora_name": name, "lora_path": f"/adapters/{name}-v{version}", "weight_version": str(version)}


async def test_each_adapter_keeps_its_version_and_is_replayed_to_an_engine_that_lost_it(engine):
    async with aiohttp.ClientSession() as client:
        url = f"http://127.0.0.1:{engine.port}"
        pool = EnginePool(client, [url], timeout=5.0)
        await pool.check_health()
        for name, version in (("a", 3), ("b", 7), ("a", 4)):  # two runs' syncs, interleaved
            await pool.fan_out("/load_lora_adapter", _load(name, version))
        served = pool.engines[url]
        assert served.healthy and served.adapter_versions == {"a": 4, "b": 7}  # b's sync left a's version alone
        assert {name: u.version for name, u in pool.updates.items()} == {"a": 4, "b": 7}

        engine.versions.clear()  # restarted: it serves no adapter
        served.healthy = False  # (down for a check)
        engine.loads.clear()
        await pool.check_health()
        assert sorted(engine.loads) == [("a", 4), ("b", 7)]  # each adapter's last load, once
        assert served.healthy and served.adapter_versions == {"a": 4, "b": 7}

        await pool.fan_out("/unload_lora_adapter", {"lora_name": "a"})  # run a is over
        assert set(pool.updates) == {"b"}  # an engine that comes back is not given a again


async def test_an_unload_one_router_fanned_out_is_forgotten_by_every_router(engine):
    """Router replicas: one fans the unload out, the others are told it (`record`, as
    `/admin/record_update` with the unload's path); none gives the adapter back to an engine
    that comes back."""
    async with aiohttp.ClientSession() as client:
        url = f"http://127.0.0.1:{engine.port}"
        first, second = (EnginePool(client, [url], timeout=5.0) for _ in range(2))
        for pool in (first, second):
            await pool.check_health()
        await first.fan_out("/load_lora_adapter", _load("a", 3))
        await second.record("/load_lora_adapter", _load("a", 3))
        await first.fan_out("/unload_lora_adapter", {"lora_name": "a"})
        await second.record("/unload_lora_adapter", {"lora_name": "a"})
        assert first.updates == second.updates == {}

        engine.loads.clear()
        for pool in (first, second):  # the engine restarts: each router checks it again
            pool.engines[url].healthy = False
            await pool.check_health()
        assert engine.loads == [] and engine.versions == {}
        with pytest.raises(ValueError, match="lora_name"):
            await second.record("/unload_lora_adapter", {})


async def test_an_unload_waits_for_a_catch_up_that_replays_its_adapter(engine):
    """A catch-up replaying an adapter's load and that adapter's unload never interleave: the
    unload lands after the replayed load, so the engine ends without the adapter."""
    async with aiohttp.ClientSession() as client:
        url = f"http://127.0.0.1:{engine.port}"
        pool = EnginePool(client, [url], timeout=5.0)
        await pool.check_health()
        await pool.fan_out("/load_lora_adapter", _load("a", 3))
        engine.versions.clear()  # restarted without it
        pool.engines[url].healthy = False
        engine.gate = asyncio.Event()
        catch_up = asyncio.create_task(pool.check_health())
        await engine.loading.wait()  # the replayed load is at the engine, not yet applied
        unload = asyncio.create_task(pool.fan_out("/unload_lora_adapter", {"lora_name": "a"}))
        with contextlib.suppress(TimeoutError):  # interleaved, the unload reaches the engine now
            await asyncio.wait_for(engine.unloaded.wait(), timeout=2)
        engine.gate.set()
        await catch_up
        [result] = await unload
        assert result["ok"] and engine.versions == {} and pool.updates == {}


async def test_a_refused_unload_keeps_the_engine_and_the_adapter(engine):
    """An unload the engine refuses (requests still use the adapter) leaves a healthy engine in the
    pool, its sessions where they are, and the adapter's load remembered."""
    async with aiohttp.ClientSession() as client:
        url = f"http://127.0.0.1:{engine.port}"
        pool = EnginePool(client, [url], timeout=5.0)
        await pool.check_health()
        await pool.fan_out("/load_lora_adapter", _load("a", 3))
        engine.busy.add("a")
        [result] = await pool.fan_out("/unload_lora_adapter", {"lora_name": "a"})
        assert not result["ok"] and result["status_code"] == 400
        assert pool.engines[url].healthy and set(pool.updates) == {"a"}


def test_an_aborted_answer_leaves_the_adapter_version_alone():
    """A request whose adapter was unloaded under it is answered aborted with the base version (it
    sampled nothing); taken as the adapter's version, it would make the engine look behind."""
    engine = Engine("http://engine", weight_version=0, adapter_versions={"a": 4})
    aborted = {"meta_info": {"finish_reason": {"type": "abort"}, "weight_version": "0"}}
    note_answer_version(engine, aborted, {"lora_path": "a"})  # type: ignore[arg-type]
    assert engine.adapter_versions == {"a": 4}
    note_answer_version(engine, {"meta_info": {"weight_version": "5"}}, {"lora_path": "a"})  # type: ignore[arg-type]
    assert engine.adapter_versions == {"a": 5}
