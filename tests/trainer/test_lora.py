"""LoRA in the Megatron trainer on CPU: frozen base, adapter-only steps, checkpoints, PEFT and merged exports."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from slimeish.common.procs import ManagedProcess, free_port, wait_http
from slimeish.train.loop import router_flags
from slimeish.trainer.batching import pack_micro_batches
from slimeish.trainer.config import LORA_ADAPTER_NAME, LossConfig, TrainerConfig
from slimeish.trainer.hf_io import megatron_params
from slimeish.trainer.trainer import Trainer
from slimeish.trainer.weight_sync import WeightSync, WeightSyncConfig
from tests.engine.sglang_schema import parse_sse
from tests.trainer.trainer_helpers import engine_samples, max_log_prob_gap, random_samples, router_samples

PROMPTS = [[1, 40, 41, 42, 43], [1, 50, 51, 52]]


def hf_log_probs(model: torch.nn.Module, samples) -> list[torch.Tensor]:
    out = []
    for s in samples:
        with torch.no_grad():
            logits = model(torch.tensor([s.tokens])).logits[0, :-1].float().log_softmax(-1)
        lp = logits.gather(-1, torch.tensor(s.tokens[1:]).unsqueeze(-1)).squeeze(-1)
        out.append(lp[-s.response_length :])
    return out


@pytest.fixture(scope="module")
def lora_trainer(tiny_model):
    """A LoRA run with one step taken, so every B is non-zero and the adapters change the model."""
    trainer = Trainer(TrainerConfig(model_path=tiny_model, lr=5e-3, lora_rank=4, lora_alpha=8))
    trainer.train_step(random_samples(2, 4, seed=11))
    return trainer


def test_only_adapters_train(tiny_model):
    trainer = Trainer(TrainerConfig(model_path=tiny_model, lr=5e-3, lora_rank=4, lora_alpha=8, lora_dropout=0.1))
    model = trainer._policy()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith((".lora.A", ".lora.B")) for n in trainable)
    # 4 targets per layer, A and B each
    assert len(trainable) == 2 * 4 * trainer.shape.num_layers
    optimized = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert optimized == {id(p) for n, p in model.named_parameters() if n in trainable}
    base = {k: v.clone() for k, v in megatron_params(model).items()}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    for step in range(2):  # B starts at zero: A's gradient is zero until B has moved
        trainer.train_step(random_samples(2, 4, seed=step))
    for k, v in megatron_params(model).items():
        assert torch.equal(v, base[k]), f"base weight {k} changed"
    after = dict(model.named_parameters())
    assert all(not torch.equal(after[n].detach(), adapters[n]) for n in trainable)
    assert set(trainer.optimizer.state) <= {p for n, p in after.items() if n in trainable}


def test_zero_rank_is_full_fine_tuning(tiny_model):
    trainer = Trainer(TrainerConfig(model_path=tiny_model))
    assert trainer.lora is None
    assert all(p.requires_grad for p in trainer._policy().parameters())
    assert not any(".lora." in n for n in trainer._policy().state_dict())


def test_merged_export_loads_with_transformers_and_matches(lora_trainer, tmp_path):
    out = lora_trainer.export_hf(tmp_path / "merged")
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    samples = random_samples(1, 3, seed=4)
    ours = lora_trainer.compute_log_probs(samples)
    base = AutoModelForCausalLM.from_pretrained(lora_trainer.config.model_path, dtype=torch.float32).eval()
    for lp, ref, base_lp in zip(ours, hf_log_probs(hf, samples), hf_log_probs(base, samples), strict=True):
        torch.testing.assert_close(torch.tensor(lp), ref, rtol=0, atol=1e-4)
        assert not torch.allclose(torch.tensor(lp), base_lp, atol=1e-4)  # the adapters do change the model


def test_peft_export_loads_with_peft_and_matches(lora_trainer, tmp_path):
    from peft import PeftModel

    out = lora_trainer.export_peft(tmp_path / "adapter")
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and "q_proj" in config["target_modules"]
    base = AutoModelForCausalLM.from_pretrained(lora_trainer.config.model_path, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, out).eval()
    samples = random_samples(1, 3, seed=5)
    ours = lora_trainer.compute_log_probs(samples)
    for lp, ref in zip(ours, hf_log_probs(peft_model, samples), strict=True):
        torch.testing.assert_close(torch.tensor(lp), ref, rtol=0, atol=1e-4)


def test_checkpoint_holds_the_adapters_and_resumes_exactly(tiny_model, tmp_path):
    cfg = TrainerConfig(model_path=tiny_model, lr=5e-3, lora_rank=2, lora_target_modules=["linear_qkv", "linear_fc2"])
    trainer = Trainer(cfg)
    trainer.train_step(random_samples(2, 2, seed=1))
    trainer.save(tmp_path / "ckpt")
    samples = random_samples(2, 2, seed=3)
    first = trainer.train_step(samples)
    fresh = Trainer(cfg)  # adapters freshly initialised: B is zero
    fresh.load(tmp_path / "ckpt")
    again = fresh.train_step(samples)
    assert again["loss"] == pytest.approx(first["loss"], abs=1e-6)
    torch.testing.assert_close(fresh.compute_log_probs(samples), trainer.compute_log_probs(samples), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lora_rank": -1}, "lora_rank"),
        ({"lora_rank": 4, "lora_dropout": 1.0}, "lora_dropout"),
        ({"lora_rank": 4, "lora_target_modules": ["q_proj"]}, "linear_qkv"),
    ],
)
def test_bad_lora_options_are_rejected(tiny_model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainerConfig(model_path=tiny_model, **kwargs)


@pytest.fixture(scope="module")
def engine(engine_factory, tiny_model):
    return engine_factory(tiny_model)


def test_sync_pushes_only_the_adapter_and_the_engine_serves_it_unmerged(tiny_model, engine, tmp_path):
    url = engine
    trainer = Trainer(TrainerConfig(model_path=tiny_model, lr=5e-2, lora_rank=4, lora_alpha=8))
    for seed in range(2):
        trainer.train_step(random_samples(2, 4, seed=seed))
    with WeightSync(WeightSyncConfig(engine_urls=[url], method="disk", disk_dir=tmp_path)) as sync:
        timings = sync.sync(trainer)
        assert {"pause", "update", "continue"} <= set(timings)
        assert [p.name for p in tmp_path.iterdir()] == ["lora-v2"]  # a PEFT directory, no base weights
        assert {p.name for p in (tmp_path / "lora-v2").iterdir()} == {
            "adapter_config.json",
            "adapter_model.safetensors",
        }
    lora, versions = engine_samples(url, PROMPTS, group_size=2, max_new_tokens=12, lora_path=LORA_ADAPTER_NAME)
    assert versions == {"2"}
    base, _ = engine_samples(url, PROMPTS, group_size=2, max_new_tokens=12)  # no lora_path: the base model
    assert max_log_prob_gap(trainer, lora) <= 1e-5
    assert max_log_prob_gap(trainer, base) > 1e-3  # the adapter does change the policy; the engine's base is untouched
    info = httpx.get(f"{url}/model_info").json()
    assert info["lora_weight_versions"][LORA_ADAPTER_NAME] == "2"  # the adapter's own version
    assert info["weight_version"] == "0"  # the base weights did not change


def test_engine_adapter_endpoints(engine, lora_trainer, tmp_path):
    url = engine
    adapter = lora_trainer.export_peft(tmp_path / "a")
    with httpx.Client(timeout=60) as client:
        bad = client.post(f"{url}/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path)})
        assert bad.status_code == 400 and bad.json()["success"] is False
        assert "PEFT adapter directory" in bad.json()["error_message"]
        ok = client.post(f"{url}/load_lora_adapter", json={"lora_name": "a", "lora_path": str(adapter)}).json()
        assert ok["success"] and ok["loaded_adapters"]["a"] == str(adapter)
        body = {"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": 2}, "lora_path": "nope"}
        unknown = client.post(f"{url}/generate", json=body)
        assert unknown.status_code == 400 and "nope" in unknown.json()["error"]["message"]
        assert client.post(f"{url}/generate", json=body | {"lora_path": "a"}).status_code == 200
        unloaded = client.post(f"{url}/unload_lora_adapter", json={"lora_name": "a"}).json()
        assert unloaded["success"] and "a" not in unloaded["loaded_adapters"]
        gone = client.post(f"{url}/unload_lora_adapter", json={"lora_name": "a"})
        assert gone.status_code == 400 and gone.json()["success"] is False


async def test_an_unload_waits_for_the_requests_using_the_adapter(engine, lora_trainer, tmp_path):
    """As SGLang's: an unload refuses new requests for the adapter at once and answers once the ones
    already generating with it are done; they finish with it, none is aborted."""
    adapter = lora_trainer.export_peft(tmp_path / "draining")
    body = {"input_ids": PROMPTS[0], "lora_path": "draining", "stream": True,
            "sampling_params": {"max_new_tokens": 64, "ignore_eos": True, "temperature": 1.0}}  # fmt: skip
    async with httpx.AsyncClient(base_url=engine, timeout=120) as client:
        load = {"lora_name": "draining", "lora_path": str(adapter)}
        (await client.post("/load_lora_adapter", json=load)).raise_for_status()
        async with client.stream("POST", "/generate", json=body) as stream:
            lines = aiter(stream.aiter_lines())
            first = await anext(lines)  # generating with the adapter now
            (await client.post("/pause_generation", json={"mode": "in_place"})).raise_for_status()
            unload = asyncio.create_task(client.post("/unload_lora_adapter", json={"lora_name": "draining"}))
            await asyncio.sleep(0.5)
            assert not unload.done()  # the request using the adapter is paused, not finished
            (await client.post("/continue_generation")).raise_for_status()
            rest = [line async for line in lines]
        chunks = parse_sse([first, *rest])
        unloaded = await unload
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 64}
    assert unloaded.status_code == 200 and "draining" not in unloaded.json()["loaded_adapters"]
    async with httpx.AsyncClient(base_url=engine, timeout=120) as client:
        late = await client.post("/generate", json=body | {"stream": False})
    assert late.status_code == 400 and "draining" in late.json()["error"]["message"]


def test_a_lora_run_through_the_router_samples_with_its_adapter(tiny_model, engine, tmp_path):
    """`slimeish train --lora-rank` starts its routers with --lora-path: every turn samples with the
    trained adapter, and the adapter sync goes through the router's admin fan-out."""
    trainer_cfg = TrainerConfig(model_path=tiny_model, lr=5e-2, lora_rank=4, lora_alpha=8, seed=3)
    flags = router_flags(trainer_cfg)
    assert flags == [f"--lora-path={LORA_ADAPTER_NAME}"]
    port, token = free_port(), "admin-secret"
    argv = ["router", "--model", str(tiny_model), "--engine", engine, "--port", str(port), "--admin-token", token]
    with ManagedProcess.slimeish(*argv, *flags, log_path=tmp_path / "router.log") as router:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=60, proc=router.proc)
        trainer = Trainer(trainer_cfg)
        trainer.train_step(random_samples(2, 4, seed=7))
        trainer.train_step(random_samples(2, 4, seed=8))
        trainer.state.weight_version = 50  # distinct from the other tests' versions on this engine
        with WeightSync(WeightSyncConfig(router_url=url, admin_token=token)) as sync:
            sync.sync(trainer)
            assert sync.serves(50, adapter=LORA_ADAPTER_NAME) and not sync.serves(50)  # the adapter's version
        samples = router_samples(url, token, PROMPTS, group_size=2, max_new_tokens=8)
        assert max_log_prob_gap(trainer, samples) <= 1e-5


def test_one_batch_mixes_the_base_model_and_an_adapter(engine, lora_trainer, tmp_path):
    """Per-row adapters: a batch whose prompts name an adapter and none decodes each row as alone."""
    adapter = lora_trainer.export_peft(tmp_path / "b")
    with httpx.Client(timeout=60) as client:
        client.post(f"{engine}/load_lora_adapter", json={"lora_name": "b", "lora_path": str(adapter)})
        params = {"max_new_tokens": 6, "temperature": 0}
        batch = {"input_ids": PROMPTS, "sampling_params": params, "return_logprob": True, "lora_path": ["b", None]}
        together = client.post(f"{engine}/generate", json=batch).raise_for_status().json()
        for prompt, lora, row in zip(PROMPTS, ["b", None], together, strict=True):
            alone = {"input_ids": prompt, "sampling_params": params, "return_logprob": True, "lora_path": lora}
            single = client.post(f"{engine}/generate", json=alone).raise_for_status().json()
            assert row["output_ids"] == single["output_ids"]
            got = [lp for lp, _, _ in row["meta_info"]["output_token_logprobs"]]
            want = [lp for lp, _, _ in single["meta_info"]["output_token_logprobs"]]
            torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=1e-5)
        client.post(f"{engine}/unload_lora_adapter", json={"lora_name": "b"}).raise_for_status()


def test_a_lora_runs_kl_reference_is_its_base_with_the_adapters_off(tiny_model):
    """kl_coef > 0 with LoRA keeps no second model: the reference is the policy with its adapters off,
    so its log-probs are the base model's while the policy's move."""
    trainer = Trainer(TrainerConfig(model_path=tiny_model, lr=5e-2, lora_rank=4, lora_alpha=8), LossConfig(kl_coef=0.1))
    assert trainer.reference is None
    trainer.train_step(random_samples(2, 4, seed=21))
    stats = trainer.train_step(random_samples(2, 4, seed=22))
    assert stats["ref_kl"] > 0  # the adapters moved the policy away from its reference
    samples = random_samples(1, 3, seed=23)
    reference: list[torch.Tensor] = [torch.empty(0)] * len(samples)
    for mb in pack_micro_batches(samples, trainer.config.micro_batch_tokens):
        log_p = trainer._reference_log_probs(mb.to(trainer.device))
        for row, i in enumerate(mb.indices):
            reference[i] = log_p[row, : samples[i].response_length]
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    policy = trainer.compute_log_probs(samples)
    for ref, base_lp, lp in zip(reference, hf_log_probs(base, samples), policy, strict=True):
        torch.testing.assert_close(ref, base_lp, rtol=0, atol=1e-4)
        assert not torch.allclose(torch.tensor(lp), base_lp, atol=1e-4)  # with the adapters on: the policy
