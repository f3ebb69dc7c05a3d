"""A real router process's `/health` names what is wrong when it is not ok: which engines are
down and why, since when; a buffer that stopped answering, at which URL. The engine and the
valkey server are real processes, SIGKILLed. Bounds are generous: the test waits for the router
to notice, it does not time it."""

from __future__ import annotations

import time
from typing import Any

import httpx

from slimeish.buffer import EmbeddedServer
from slimeish.common.procs import ManagedProcess, free_port, wait_http

GENEROUS_S = 60.0


def unhealthy(url: str) -> dict[str, Any]:
    """The body of the router's first `/health` answered 503 (fails if it stays 200)."""
    deadline = time.monotonic() + GENEROUS_S
    while time.monotonic() < deadline:
        answer = httpx.get(url + "/health", timeout=GENEROUS_S)
        if answer.status_code == 503:
            body: dict[str, Any] = answer.json()
            return body
        assert answer.status_code == 200, answer.text
        time.sleep(0.2)
    raise AssertionError("the router kept answering /health 200")


def test_health_names_a_killed_engine_then_an_unreachable_buffer(tiny_model, tmp_path):
    engine_port, router_port = free_port(), free_port()
    engine_url, url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{router_port}"
    engine = ManagedProcess.slimeish(
        "engine", "--model", str(tiny_model), "--port", str(engine_port), log_path=tmp_path / "engine.log"
    )
    with engine, EmbeddedServer(tmp_path / "buffer") as valkey:
        wait_http(engine_url + "/health", timeout=120, proc=engine.proc)
        args = ["router", "--model", str(tiny_model), "--engine", engine_url, "--port", str(router_port),
                "--buffer-url", valkey.url, "--health-interval", "0.2"]  # fmt: skip
        with ManagedProcess.slimeish(*args, log_path=tmp_path / "router.log") as router:
            wait_http(url + "/health", timeout=120, proc=router.proc)
            healthy = httpx.get(url + "/health").json()
            assert healthy["ok"] and healthy["problems"] == [] and healthy["buffer"] is None
            assert healthy["engines"] == [{"url": engine_url, "healthy": True, "failure": None, "down_since": None}]

            engine.kill()
            report = unhealthy(url)
            assert not report["ok"] and report["healthy_engines"] == 0
            (problem,) = report["problems"]
            assert problem.startswith(f"no healthy engine: {engine_url}: "), problem
            assert "since" in problem, problem
            (down,) = report["engines"]
            assert down["url"] == engine_url and not down["healthy"] and down["down_since"] <= time.time()
            assert down["failure"] and down["failure"] in problem

            valkey.kill()
            deadline = time.monotonic() + GENEROUS_S
            while len((report := unhealthy(url))["problems"]) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            engines, buffer = report["problems"]
            assert engines.startswith(f"no healthy engine: {engine_url}: "), engines
            assert buffer.startswith(f"the buffer at {valkey.url} is unreachable ("), buffer
            assert report["buffer"]["url"] == valkey.url and report["buffer"]["failure"] in buffer
