"""Many policies, one fleet: two LoRA runs share one embedded engine. Each run has its own router
(its buffer namespace) and trainer; their adapters, of different weights and versions, are served
side by side. Run A's router asks for its adapter by --lora-path (as `slimeish train --lora-name a`
starts it), run B's sessions are bound to theirs when opened (`lora_path` in POST /sessions).
Sessions of both runs interleave, with the same group ids: each stored sample's log-probs are its
own trainer's, never the other's, and each run's buffer holds only its own groups.

Tested at the router + engine + trainer-forward level (no `slimeish train` process): two full runs
would start two trainers, two routers and the engine on a machine shared with other test suites."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.common.procs import ManagedProcess, free_port, wait_http
from slimeish.common.sample import Sample
from slimeish.train.loop import router_flags
from slimeish.trainer.config import TrainerConfig
from slimeish.trainer.trainer import Trainer
from slimeish.trainer.weight_sync import WeightSync, WeightSyncConfig
from tests.trainer.trainer_helpers import max_log_prob_gap, random_samples

PROMPTS = [[1, 40, 41, 42, 43], [1, 50, 51, 52]]
GROUP_SIZE = 2
TOKEN = "admin-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def valkey(tmp_path_factory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("valkey")) as server:
        yield server


def _trainer(tiny_model, name: str, seed: int, version: int) -> Trainer:
    """A LoRA trainer one step in (adapters of its own: its seed and its data), at `version`."""
    trainer = Trainer(
        TrainerConfig(model_path=tiny_model, lr=5e-2, lora_rank=4, lora_alpha=8, seed=seed, lora_name=name)
    )
    trainer.train_step(random_samples(2, 4, seed=seed))
    trainer.state.weight_version = version
    return trainer


def _start_router(
    tiny_model, engine: str, buffer_url: str, run_id: str, flags: list[str], log
) -> tuple[ManagedProcess, str]:
    port = free_port()
    argv = ["router", "--model", str(tiny_model), "--engine", engine, "--port", str(port), "--admin-token", TOKEN,
            "--buffer-url", buffer_url, "--run-id", run_id, *flags]  # fmt: skip
    proc = ManagedProcess.slimeish(*argv, log_path=log)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", timeout=60, proc=proc.proc)
    return proc, url


def _episode(client: httpx.Client, router: str, group: int, index: int, lora_path: str | None) -> None:
    """One session (bound to `lora_path` when given): one token-in turn at temperature 1, finished."""
    body = {"group_id": f"g{group}", "index": index, "group_size": GROUP_SIZE}
    session = client.post(f"{router}/sessions", json=body | ({"lora_path": lora_path} if lora_path else {}),
                          headers=AUTH).raise_for_status().json()  # fmt: skip
    turn = {"input_ids": PROMPTS[group], "sampling_params": {"max_new_tokens": 8, "temperature": 1.0}}
    client.post(f"{router}/s/{session['api_key']}/generate", json=turn).raise_for_status()
    client.post(
        f"{router}/sessions/{session['session_id']}/finish", json={"reward": 1.0}, headers=AUTH
    ).raise_for_status()


async def _groups(buffer_url: str, run_id: str) -> dict[str, list[Sample]]:
    async with Buffer(buffer_url, run_id) as buffer:
        taken = await buffer.take_groups(10, "test")
    return {g.group_id: g.samples for g in taken.groups}


def test_two_lora_runs_share_one_engine(tiny_model, engine_factory, valkey, tmp_path):
    engine = engine_factory(tiny_model)
    trainers = {
        "run-a": _trainer(tiny_model, "a", seed=1, version=3),
        "run-b": _trainer(tiny_model, "b", seed=2, version=7),
    }
    flags_a = router_flags(trainers["run-a"].config)
    assert flags_a == ["--lora-path=a"]  # the router asks for the name the run's sync loads
    router_a, url_a = _start_router(tiny_model, engine, valkey.url, "run-a", flags_a, tmp_path / "a.log")
    router_b, url_b = _start_router(tiny_model, engine, valkey.url, "run-b", [], tmp_path / "b.log")
    routers = {"run-a": url_a, "run-b": url_b}
    with router_a, router_b:
        for run, trainer in trainers.items():
            name = trainer.config.lora_name
            cfg = WeightSyncConfig(router_url=routers[run], admin_token=TOKEN, method="disk",
                                   disk_dir=tmp_path / run, lora_name=name)  # fmt: skip
            with WeightSync(cfg) as sync:
                sync.sync(trainer)
                assert sync.serves(trainer.weight_version, adapter=name)
        # each adapter keeps its own version on the engine; neither sync put the engine behind the other's router
        info = httpx.get(f"{engine}/model_info").json()
        assert info["lora_weight_versions"] == {"a": "3", "b": "7"}
        for run, url in routers.items():
            pool = httpx.get(f"{url}/admin/engines", headers=AUTH).json()
            name = trainers[run].config.lora_name
            assert pool["adapter_versions"] == {name: trainers[run].weight_version}
            assert [e["healthy"] for e in pool["engines"]] == [True]
        with httpx.Client(timeout=120) as client:  # the runs' sessions interleave, on the same group ids
            for group in range(len(PROMPTS)):
                for index in range(GROUP_SIZE):
                    _episode(client, url_a, group, index, None)  # the router's --lora-path
                    _episode(client, url_b, group, index, "b")  # bound to its policy when opened
    stored = {run: asyncio.run(_groups(valkey.url, run)) for run in trainers}
    for run, other in (("run-a", "run-b"), ("run-b", "run-a")):
        groups = stored[run]
        assert sorted(groups) == ["g0", "g1"] and all(len(s) == GROUP_SIZE for s in groups.values())
        samples = [s for group in groups.values() for s in group]
        assert {v for s in samples for v in s.weight_versions} == {trainers[run].weight_version}
        # each sample says the adapter that sampled it (bound when opened, or the router's --lora-path)
        assert {s.metadata.get("lora_path") for s in samples} == {trainers[run].config.lora_name}
        assert max_log_prob_gap(trainers[run], samples) <= 1e-5  # sampled with its own adapter, unmerged
        assert max_log_prob_gap(trainers[other], samples) > 1e-3  # not with the other run's
