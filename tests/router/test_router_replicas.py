"""Several routers on one run: they share the engines and the buffer. A weight update reaches
each engine once (one router fans it out, the others record it, and catching up never moves an
engine back); a restarted router recovers only the sessions it opened."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
from safetensors.torch import load_file

from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.common.procs import ManagedProcess, free_port, wait_http
from slimeish.common.sample import Sample
from slimeish.rollout import RolloutConfig
from slimeish.rollout_functions.sessions import Session, http_client, run_groups
from slimeish.trainer.weight_sync import WeightSync, WeightSyncConfig
from tests.router.conftest import ADMIN_TOKEN, chat_episode, start_engine

UPDATE_LINE = "POST /update_weights_from_tensor"


class Weights:
    """The tiny model's own weights under a version the test sets (a `SyncSource`)."""

    lora = None  # a full fine-tuning run

    def __init__(self, model: Path):
        self.state = load_file(model / "model.safetensors")
        self.weight_version = 0

    def hf_state_dict(self):
        return self.state

    def export_hf(self, out_dir):
        raise AssertionError("the tensor method does not export")


def updates_received(log: Path) -> int:
    """Weight updates the engine answered, counted in its own access log."""
    return log.read_text().count(UPDATE_LINE)


def reported(router: str) -> tuple[int | None, list[int | None]]:
    d = httpx.get(router + "/admin/engines", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    return d["weight_version"], [e["weight_version"] for e in d["engines"]]


def test_each_engine_takes_each_update_once_and_every_router_reports_it(tiny_model, tmp_path, router_factory):
    engines = [start_engine(tiny_model, tmp_path, f"engine{i}", "--log-level", "info") for i in range(2)]
    try:
        urls = [url for _, url in engines]
        logs = [proc.log_path for proc, _ in engines]
        first, second = (router_factory(urls, health_interval=0.2).url for _ in range(2))
        weights = Weights(tiny_model)
        config = WeightSyncConfig(router_url=first, record_router_urls=[second], admin_token=ADMIN_TOKEN)
        with WeightSync(config) as sync:
            for _ in range(3):
                weights.weight_version += 1
                sync.sync(weights)
            time.sleep(1)  # health checks of both routers run meanwhile: none replays an update
            assert [updates_received(log) for log in logs] == [3, 3]
            assert reported(first) == reported(second) == (3, [3, 3])

        # The second router learns of version 4 late (it is not told): it must not take the
        # engines back to version 3, the update it knows.
        with WeightSync(WeightSyncConfig(router_url=first, admin_token=ADMIN_TOKEN)) as sync:
            weights.weight_version += 1
            sync.sync(weights)
        for url in urls:  # re-admitted (as after a restart): it reads each engine's version again
            r = httpx.post(
                second + "/admin/engines", json={"url": url}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
            )
            assert r.status_code == 200 and r.json()["weight_version"] == 4, r.text
        assert [updates_received(log) for log in logs] == [4, 4]
        assert reported(first) == (4, [4, 4]) and reported(second)[0] == 3
        assert [httpx.get(url + "/model_info").json()["weight_version"] for url in urls] == ["4", "4"]
    finally:
        for proc, _ in engines:
            proc.stop()


def start_router(model: Path, engine: str, buffer_url: str, port: int, router_id: str, log: Path) -> ManagedProcess:
    argv = ["router", "--model", str(model), "--engine", engine, "--port", str(port), "--buffer-url", buffer_url,
            "--run-id", "replicas", "--admin-token", ADMIN_TOKEN, "--router-id", router_id,
            "--recover-open-sessions"]  # fmt: skip
    proc = ManagedProcess.slimeish(*argv, log_path=log)
    wait_http(f"http://127.0.0.1:{port}/health", timeout=60, proc=proc.proc)
    return proc


def open_session(router: str, index: int) -> dict:
    body = {"group_id": "g", "index": index, "group_size": 2, "metadata": {"prompt": "p"}}
    r = httpx.post(router + "/sessions", json=body, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    return r.raise_for_status().json()


async def test_a_restarted_router_recovers_only_its_own_sessions(tiny_model, engine_url, tmp_path):
    ports = [free_port(), free_port()]
    routers = [f"http://127.0.0.1:{port}" for port in ports]
    with EmbeddedServer(tmp_path / "buffer") as valkey:
        started = [start_router(tiny_model, engine_url, valkey.url, p, f"router{i}", tmp_path / f"r{i}.log")
                   for i, p in enumerate(ports)]  # fmt: skip
        try:
            lost, kept = open_session(routers[0], 0), open_session(routers[1], 1)
            started[0].kill(signal.SIGKILL)  # it held `lost`; the same command starts it again
            started[0].proc.wait()
            started[0].stop()
            started[0] = start_router(tiny_model, engine_url, valkey.url, ports[0], "router0", tmp_path / "again.log")
            async with Buffer(valkey.url, "replicas") as buffer:
                (request,) = await buffer.pop_regenerate(10)
                assert (request.group_id, request.indices) == ("g", [0])
                views = await buffer.sessions([lost["session_id"], kept["session_id"]])
                assert views[lost["session_id"]].status == "aborted"
                assert views[kept["session_id"]].status == "pending"
                await chat_episode(kept["base_url"], ["hi"], max_tokens=2)  # the other router's session goes on
                finish = f"{routers[1]}/sessions/{kept['session_id']}/finish"
                r = httpx.post(finish, json={"reward": 1.0}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                assert r.status_code == 200, r.text
                assert (await buffer.sessions([kept["session_id"]]))[kept["session_id"]].status == "completed"
        finally:
            for proc in started:
                proc.stop()


def test_a_rollout_spreads_its_sessions_and_each_stays_on_its_router(router_factory, engine_url):
    routers = [router_factory([engine_url]) for _ in range(2)]
    cfg = RolloutConfig(rollout_max_response_len=2, n_samples_per_prompt=2)
    urls = [r.url for r in routers]
    args = SimpleNamespace(**dataclasses.asdict(cfg), router_url=urls[0], router_urls=urls, admin_token=ADMIN_TOKEN)

    async def episode(session: Session, sample: Sample) -> Sample:
        assert session.base_url.startswith(session.router_url + "/s/")  # its turns go to the router that opened it
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        (await http_client().post(session.base_url + "/chat/completions", json=chat)).raise_for_status()
        sample.reward, sample.status = 1.0, Sample.Status.COMPLETED
        return sample

    groups = [[Sample(group_index=g, index=i, prompt="hi") for i in range(2)] for g in range(2)]
    done = asyncio.run(run_groups(args, groups, episode, rollout_id=0, evaluation=False))
    assert [s.status for g in done for s in g] == [Sample.Status.COMPLETED] * 4
    for router in routers:  # two sessions each, each captured and finished where it was opened
        assert len(router.store.sessions) == 2 and set(router.store.finished) == set(router.store.sessions)
        assert all(len(turns) == 1 for turns in router.store.turns.values())
