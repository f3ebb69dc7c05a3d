"""The embedded engine applies adapter loads in the order they arrived, whatever each one's read takes.

A load reads its PEFT files off the event loop, so two loads of one name overlap: here the earlier
one (version 1) reads slowly, until the later one (version 2) has been installed or a few seconds
passed. Installed as each read finishes, version 1 would overwrite version 2. The app is the real
engine's, in process (its reader wrapped to be slow), the adapters real PEFT directories.
"""

from __future__ import annotations

import asyncio
import threading

import httpx

from slimeish.engine.config import EngineConfig
from slimeish.engine.server import create_app
from tests.peft_adapters import write_peft_adapter


async def test_a_slow_earlier_load_never_overwrites_a_later_one(tiny_model, tmp_path):
    v1, v2 = (write_peft_adapter(tiny_model, tmp_path / f"v{v}", v) for v in (1, 2))
    app = create_app(EngineConfig(model=str(tiny_model)))
    lora = app.state.engine.runner.lora
    read, install = lora.read, lora.install
    reading_v1, v2_installed = threading.Event(), threading.Event()

    def slow_read(name: str, path: str):
        if path == v1:
            reading_v1.set()
            v2_installed.wait(timeout=3)  # out of order, v2 is installed meanwhile; in order, it waits for v1
        return read(name, path)

    def noting_install(adapter, version):
        served = install(adapter, version)
        if adapter.path == v2:
            v2_installed.set()
        return served

    lora.read, lora.install = slow_read, noting_install
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://engine", timeout=60) as client:

        def load(path: str, version: int):
            body = {"lora_name": "policy", "lora_path": path, "weight_version": str(version)}
            return asyncio.create_task(client.post("/load_lora_adapter", json=body))

        first = load(v1, 1)
        await asyncio.to_thread(reading_v1.wait, 30)  # v1's read has begun before v2 is sent
        second = load(v2, 2)
        replies = [(await first).json(), (await second).json()]
    assert [r["success"] for r in replies] == [True, True]
    assert lora.versions["policy"] == 2 and lora.adapters["policy"].path == v2  # the later load is served
