"""Against a real embedded engine: on-policy log-probs agree, and a weight sync changes what it serves."""

from __future__ import annotations

import time

import httpx
import pytest
import torch

from slimeish.common.procs import ManagedProcess, free_port, wait_http
from slimeish.trainer.config import LossConfig, TrainerConfig
from slimeish.trainer.trainer import Trainer
from slimeish.trainer.weight_sync import WeightSync, WeightSyncConfig, WeightSyncError
from tests.trainer.trainer_helpers import engine_samples, router_samples

PROMPTS = [[1, 40, 41, 42, 43], [1, 50, 51, 52]]


def _max_abs_diff(trainer: Trainer, samples) -> float:
    ours = trainer.compute_log_probs(samples)
    return max(
        (torch.tensor(a) - torch.tensor(s.rollout_log_probs)).abs().max().item()
        for a, s in zip(ours, samples, strict=True)
    )


def test_on_policy_step_then_sync_from_tensor_and_disk(tiny_model, engine, tmp_path):
    url = engine
    trainer = Trainer(TrainerConfig(model_path=tiny_model, lr=1e-2), LossConfig(old_log_probs="rollout"))

    samples, versions = engine_samples(url, PROMPTS, group_size=4, max_new_tokens=12)
    assert versions == {"0"}
    assert _max_abs_diff(trainer, samples) <= 1e-4  # trainer and engine compute the same policy
    for i, s in enumerate(samples):
        s.reward = float(i % 2)
    metrics = trainer.train_step(samples)
    assert abs(metrics["ppo_kl"]) <= 1e-6 and abs(metrics["rollout_kl"]) <= 1e-6
    assert metrics["clip_fraction"] == 0.0

    stale, _ = engine_samples(url, PROMPTS, group_size=1, max_new_tokens=12, seed=100)
    assert _max_abs_diff(trainer, stale) > 1e-3  # the engine still serves the old weights

    with WeightSync(WeightSyncConfig(engine_urls=[url], method="tensor")) as sync:
        timings = sync.sync(trainer)
    assert {"serialize", "pause", "flush", "update", "continue", "total"} <= set(timings)
    fresh, versions = engine_samples(url, PROMPTS, group_size=2, max_new_tokens=12, seed=200)
    assert versions == {"1"}
    assert _max_abs_diff(trainer, fresh) <= 1e-4

    for i, s in enumerate(fresh):
        s.reward = float(i % 2)
    trainer.train_step(fresh)
    with WeightSync(WeightSyncConfig(engine_urls=[url], method="disk", disk_dir=tmp_path)) as sync:
        sync.sync(trainer)
        assert [p.name for p in tmp_path.iterdir()] == ["v2"]
        trainer.state.weight_version += 1  # same weights under a new version
        sync.sync(trainer)
    assert [p.name for p in tmp_path.iterdir()] == ["v3"]  # older exports are removed
    fresh, versions = engine_samples(url, PROMPTS, group_size=2, max_new_tokens=12, seed=300)
    assert versions == {"3"}
    assert _max_abs_diff(trainer, fresh) <= 1e-4


@pytest.fixture(scope="module")
def engine(engine_factory, tiny_model):
    return engine_factory(tiny_model)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_on_policy_log_probs_other_families(tiny_model_factory, engine_factory, arch):
    """Untied embeddings (llama) and qk-norm (qwen3) agree with the engine as well."""
    model = tiny_model_factory(arch)
    url = engine_factory(model)
    trainer = Trainer(TrainerConfig(model_path=model), LossConfig(old_log_probs="rollout"))
    samples, _ = engine_samples(url, PROMPTS, group_size=2, max_new_tokens=10)
    assert _max_abs_diff(trainer, samples) <= 1e-4


def test_sync_reports_engine_errors(engine, tmp_path):
    url = engine
    _, before = engine_samples(url, PROMPTS[:1], group_size=1, max_new_tokens=2)

    class Broken:  # a trainer whose export is not a checkpoint directory
        weight_version = 5
        lora = None  # a full fine-tuning run

        def export_hf(self, out_dir):
            return tmp_path / "missing"

        def hf_state_dict(self):
            raise AssertionError("not used by the disk method")

    with WeightSync(WeightSyncConfig(engine_urls=[url], method="disk")) as sync, pytest.raises(WeightSyncError):
        sync.sync(Broken())
    _, versions = engine_samples(url, PROMPTS[:1], group_size=1, max_new_tokens=2)
    assert versions == before  # generation was continued and the version kept


def test_on_policy_through_router_then_sync_through_admin_fan_out(engine, tiny_model, tmp_path):
    """Samples captured by a real router agree with a fresh trainer (PPO KL 0); the weight sync
    then goes through the router's /admin endpoints (bearer admin token)."""
    port, token = free_port(), "admin-secret"
    argv = ["router", "--model", str(tiny_model), "--engine", engine, "--port", str(port), "--admin-token", token]
    with ManagedProcess.slimeish(*argv, log_path=tmp_path / "router.log") as router:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=60, proc=router.proc)
        trainer = Trainer(TrainerConfig(model_path=tiny_model, lr=1e-2), LossConfig(old_log_probs="rollout"))
        _, served = engine_samples(engine, PROMPTS[:1], group_size=1, max_new_tokens=1)
        trainer.state.weight_version = int(served.pop()) + 1  # earlier tests in this module moved the engine on
        with WeightSync(WeightSyncConfig(engine_urls=[engine], method="tensor")) as sync:
            sync.sync(trainer)  # back to the initial weights, under a new version
        samples = router_samples(url, token, PROMPTS, group_size=2, max_new_tokens=8)
        assert _max_abs_diff(trainer, samples) <= 1e-4
        metrics = trainer.train_step(samples)
        assert abs(metrics["ppo_kl"]) <= 1e-6
        trainer.state.weight_version = 40 + trainer.weight_version  # distinct from the other tests' versions
        with WeightSync(WeightSyncConfig(router_url=url, admin_token="wrong")) as sync, pytest.raises(WeightSyncError):
            sync.sync(trainer)
        with WeightSync(WeightSyncConfig(router_url=url, admin_token=token)) as sync:
            assert not sync.serves(trainer.weight_version)
            sync.sync(trainer)
            assert sync.serves(trainer.weight_version)
        with WeightSync(WeightSyncConfig(engine_urls=[engine], method="tensor")) as sync:
            assert sync.serves(trainer.weight_version) and not sync.serves(trainer.weight_version + 1)
    fresh, versions = engine_samples(engine, PROMPTS, group_size=1, max_new_tokens=6)
    assert versions == {str(trainer.weight_version)}
    assert _max_abs_diff(trainer, fresh) <= 1e-4


def test_sync_skips_a_dead_engine_and_the_router_catches_it_up_when_it_returns(engine, tiny_model, tmp_path):
    """One of two engines is SIGKILLed: the sync through the router updates the other and skips
    it; restarted on its port with the initial weights, it is re-admitted only once the router
    has loaded the current version into it (the file of which the sync keeps until the next)."""
    port, token = free_port(), "admin-secret"
    doomed_port = free_port()
    doomed_url = f"http://127.0.0.1:{doomed_port}"

    def start_doomed() -> ManagedProcess:
        argv = ["engine", "--model", str(tiny_model), "--port", str(doomed_port)]
        proc = ManagedProcess.slimeish(*argv, log_path=tmp_path / "doomed.log")
        wait_http(doomed_url + "/health", timeout=120, proc=proc.proc)
        return proc

    doomed = start_doomed()
    argv = ["router", "--model", str(tiny_model), "--engine", engine, "--engine", doomed_url, "--port", str(port)]
    argv += ["--admin-token", token, "--health-interval", "0.2"]
    with ManagedProcess.slimeish(*argv, log_path=tmp_path / "router.log") as router, doomed:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=60, proc=router.proc)
        trainer = Trainer(TrainerConfig(model_path=tiny_model), LossConfig(old_log_probs="rollout"))
        trainer.state.weight_version = 70  # distinct from the other tests' versions of the shared engine
        doomed.kill()
        shm = tmp_path / "shm"
        shm.mkdir()
        with WeightSync(WeightSyncConfig(router_url=url, admin_token=token, shm_dir=shm)) as sync:
            sync.sync(trainer)
            assert len(list(shm.iterdir())) == 1  # kept: the router replays it to the dead engine
            engines = {e["url"]: e for e in httpx.get(f"{url}/admin/engines", headers=_bearer(token)).json()["engines"]}
            assert engines[engine]["weight_version"] == 70 and not engines[doomed_url]["healthy"]

            with start_doomed():  # back on its port, serving version 0
                deadline = time.monotonic() + 60
                while not engines[doomed_url]["healthy"] and time.monotonic() < deadline:
                    time.sleep(0.2)
                    reply = httpx.get(f"{url}/admin/engines", headers=_bearer(token)).json()
                    engines = {e["url"]: e for e in reply["engines"]}
                assert engines[doomed_url] | {"healthy": True, "weight_version": 70} == engines[doomed_url]
                fresh, versions = engine_samples(doomed_url, PROMPTS, group_size=1, max_new_tokens=6)
                assert versions == {"70"} and _max_abs_diff(trainer, fresh) <= 1e-4  # the weights, not just a number
        assert not list(shm.iterdir())  # removed once the sync is closed


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_sync_config_needs_one_target():
    with pytest.raises(ValueError):
        WeightSyncConfig()
    with pytest.raises(ValueError):
        WeightSyncConfig(router_url="http://x", engine_urls=["http://y"], admin_token="t")
    with pytest.raises(ValueError, match="admin_token"):
        WeightSyncConfig(router_url="http://x")
    with pytest.raises(ValueError, match="engine_urls"):
        WeightSyncConfig(router_url="http://x", admin_token="t", method="distributed")


def test_nccl_buckets_respect_the_byte_bound():
    from slimeish.trainer.nccl_broadcast import NcclWeightBroadcast

    state = {f"w{i}": torch.zeros(n) for i, n in enumerate([10, 10, 30, 5, 50])}  # float32: 4 bytes each
    with httpx.Client() as client:
        nccl = NcclWeightBroadcast(["http://engine"], client, "127.0.0.1", 1, bucket_bytes=100)
        buckets = [[name for name, _ in b] for b in nccl._buckets(state)]
        nccl.close()
    assert buckets == [["w0", "w1"], ["w2"], ["w3"], ["w4"]]  # a tensor over the bound goes alone
