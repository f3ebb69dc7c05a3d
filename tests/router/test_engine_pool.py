"""Several engines: an smg router as one engine URL, an engine killed mid-episode, and an engine
refused for its weight version."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import httpx
import openai
from fastapi import FastAPI

from slimeish.common.procs import ManagedProcess, free_port, wait_http
from tests.stand_in import serve_app

SMG = shutil.which("smg") or str(Path(sys.executable).with_name("smg"))


def chat(session: dict, messages: list[dict]) -> dict:
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=3)
    return r.choices[0].message.model_dump(exclude_none=True)


def episode(router, turns: int, between=None) -> tuple[dict, list]:
    session = router.new_session()
    messages = [{"role": "user", "content": "hello"}]
    for turn in range(turns):
        messages += [chat(session, messages), {"role": "user", "content": f"turn {turn}"}]
        if between:
            between(turn, session)
    return session, messages


def test_engine_killed_mid_episode_finishes_on_another(router_factory, extra_engine, engine_url):
    proc, doomed = extra_engine
    router = router_factory([doomed], health_interval=60.0)  # no health check during the test

    def kill_after_first(turn, session):
        if turn == 0:
            assert router.record(session["session_id"])["engine"] == doomed
            added = httpx.post(router.url + "/admin/engines", json={"url": engine_url}, headers=router.admin)
            assert added.json()["healthy"]
            proc.kill()

    session, _ = episode(router, 3, kill_after_first)
    record = router.record(session["session_id"])
    assert record["engine"] == engine_url and record["turns"] == 3
    assert [s["split_reason"] for s in record["segments"]] == [None]  # one exact segment across engines
    engines = {e["url"]: e for e in httpx.get(router.url + "/admin/engines", headers=router.admin).json()["engines"]}
    assert not engines[doomed]["healthy"] and engines[engine_url]["healthy"]
    httpx.post(f"{router.url}/sessions/{session['session_id']}/finish", json={"reward": 1}, headers=router.admin)
    turns = router.store.turns[session["session_id"]]
    assert [t.engine for t in turns] == [doomed, engine_url, engine_url]
    (sample,) = router.store.samples(session["session_id"])
    assert sum(sample.loss_mask) == sum(len(t.output_ids) for t in turns)
    metrics = httpx.get(router.url + "/metrics").text
    assert f'router_engine_healthy{{engine="{doomed}"}} 0.0' in metrics


def test_smg_router_in_front_of_two_engines(router_factory, extra_engine, engine_url, tmp_path):
    _, second = extra_engine
    port = free_port()
    smg = ManagedProcess(
        [
            SMG,
            "launch",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            engine_url,
            second,
            "--policy",
            "round_robin",
        ],
        log_path=tmp_path / "smg.log",
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=60, proc=smg.proc)
        router = router_factory([f"http://127.0.0.1:{port}"])
        sessions = [episode(router, 2)[0] for _ in range(2)]
        for s in sessions:
            httpx.post(f"{router.url}/sessions/{s['session_id']}/finish", json={"reward": 0}, headers=router.admin)
            (sample,) = router.store.samples(s["session_id"])
            assert sample.split_reason is None and sum(sample.loss_mask) > 0
        flushed = httpx.post(router.url + "/admin/flush_cache", headers=router.admin).json()
        assert flushed["engines"][0]["url"] == f"http://127.0.0.1:{port}"
    finally:
        smg.stop()


def sglang_default_version_app() -> FastAPI:
    """Stands in for an SGLang server started without --weight-version: it reports SGLang's
    default version string (the embedded engine only takes integers)."""
    app = FastAPI()
    app.get("/health")(lambda: {})
    app.get("/model_info")(lambda: {"model_path": "tiny", "weight_version": "default"})
    return app


def test_engine_with_a_non_integer_weight_version_is_refused(router_factory, engine_url):
    with serve_app(sglang_default_version_app()) as bad:
        router = router_factory([bad, engine_url])
        listed = httpx.get(router.url + "/admin/engines", headers=router.admin).json()["engines"]
        engines = {e["url"]: e for e in listed}
        assert not engines[bad]["healthy"] and "--weight-version 0" in engines[bad]["refused"]
        assert engines[engine_url]["healthy"] and engines[engine_url]["refused"] is None
        session, _ = episode(router, 1)  # served by the good engine only
        assert router.record(session["session_id"])["engine"] == engine_url
        r = httpx.post(router.url + "/admin/engines", json={"url": bad}, headers=router.admin)  # checked again
        assert r.status_code == 400 and "--weight-version 0" in r.json()["error"]["message"]
        engines = httpx.get(router.url + "/admin/engines", headers=router.admin).json()["engines"]
        assert [e["url"] for e in engines] == [engine_url]
