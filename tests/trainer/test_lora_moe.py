"""LoRA on a Mixture-of-Experts model (the tiny Qwen3-MoE, GLM-4.5): adapters on every routed
expert's linears, base frozen, served unmerged by the embedded engine, exported as PEFT
`target_parameters` on transformers' fused experts and as a merged checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from slimeish.common.procs import free_port
from slimeish.trainer.config import LORA_ADAPTER_NAME, LossConfig, TrainerConfig
from slimeish.trainer.hf_io import megatron_params
from slimeish.trainer.trainer import Trainer
from slimeish.trainer.weight_sync import WeightSync, WeightSyncConfig
from tests.trainer.test_expert_parallel import LR, _assert_same_update
from tests.trainer.test_lora import PROMPTS, hf_log_probs
from tests.trainer.trainer_helpers import engine_samples, max_log_prob_gap, random_samples

EXPERT_TARGETS = ["experts.linear_fc1", "experts.linear_fc2"]


def lora_moe_trainer(model_dir, **kwargs) -> Trainer:
    """A LoRA run with two steps taken: every B, A too, has moved."""
    trainer = Trainer(TrainerConfig(model_path=model_dir, lr=5e-2, lora_rank=2, lora_alpha=4, **kwargs))
    for seed in range(2):
        trainer.train_step(random_samples(2, 3, seed=seed))
    return trainer


@pytest.fixture(scope="module")
def qwen3_moe(tiny_model_factory):
    return tiny_model_factory("qwen3_moe")


@pytest.fixture(scope="module")
def trained(qwen3_moe):
    return lora_moe_trainer(qwen3_moe)


def test_only_adapters_train_and_every_routed_expert_has_one(qwen3_moe):
    trainer = Trainer(TrainerConfig(model_path=qwen3_moe, lr=5e-2, lora_rank=2, lora_target_modules=EXPERT_TARGETS))
    model = trainer._policy()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    experts, layers = trainer.shape.num_experts, trainer.shape.num_layers
    assert len(trainable) == layers * experts * 2 * 2  # fc1 and fc2 of every expert, A and B each
    assert all(".mlp.experts.local_experts." in n and n.endswith((".lora.A", ".lora.B")) for n in trainable)
    base = {k: v.clone() for k, v in megatron_params(model).items()}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    for seed in range(2):
        trainer.train_step(random_samples(2, 3, seed=seed))
    for k, v in megatron_params(model).items():
        assert torch.equal(v, base[k]), f"base weight {k} changed"  # router and experts too
    after = dict(model.named_parameters())
    moved = {n for n in trainable if not torch.equal(after[n].detach(), adapters[n])}
    # an expert no token was routed to in either step keeps its adapter; most are used
    assert len(moved) >= len(trainable) // 2, sorted(trainable - moved)
    assert set(trainer.optimizer.state) <= {p for n, p in after.items() if n in trainable}


def test_peft_export_loads_on_the_fused_experts_and_matches(trained, tmp_path):
    from peft import PeftModel

    out = trained.export_peft(tmp_path / "adapter")
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["target_parameters"] == ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    assert config["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]  # Qwen3-MoE has no dense MLP
    tensors = load_file(out / "adapter_model.safetensors")
    experts_b = [t for k, t in tensors.items() if ".mlp.experts." in k and "lora_B" in k]
    assert len(experts_b) == 2 * trained.shape.num_layers and all(t.abs().max() > 0 for t in experts_b)
    base = AutoModelForCausalLM.from_pretrained(trained.config.model_path, dtype=torch.float32).eval()
    samples = random_samples(1, 3, seed=5)
    base_lps = hf_log_probs(base, samples)
    peft_model = PeftModel.from_pretrained(base, out).eval()
    ours = trained.compute_log_probs(samples)
    for lp, ref, base_lp in zip(ours, hf_log_probs(peft_model, samples), base_lps, strict=True):
        torch.testing.assert_close(torch.tensor(lp), ref, rtol=0, atol=1e-4)
        assert not torch.allclose(torch.tensor(lp), base_lp, atol=1e-3)  # the adapter does change the model


def test_merged_export_loads_with_transformers_and_matches(trained, tmp_path):
    hf = AutoModelForCausalLM.from_pretrained(trained.export_hf(tmp_path / "merged"), dtype=torch.float32).eval()
    samples = random_samples(1, 3, seed=6)
    for lp, ref in zip(trained.compute_log_probs(samples), hf_log_probs(hf, samples), strict=True):
        torch.testing.assert_close(torch.tensor(lp), ref, rtol=0, atol=1e-4)


def test_the_adapter_sync_serves_the_expert_adapters_unmerged(engine_factory, qwen3_moe, trained, tmp_path):
    url = engine_factory(qwen3_moe)
    with WeightSync(WeightSyncConfig(engine_urls=[url], method="disk", disk_dir=tmp_path)) as sync:
        sync.sync(trained)
    adapter_bytes = (tmp_path / "lora-v2" / "adapter_model.safetensors").stat().st_size
    model_bytes = sum(f.stat().st_size for f in qwen3_moe.glob("*.safetensors"))
    assert adapter_bytes < model_bytes / 10  # the adapter alone moved, not the model
    lora, versions = engine_samples(url, PROMPTS, group_size=2, max_new_tokens=12, lora_path=LORA_ADAPTER_NAME)
    assert versions == {"2"}
    base, _ = engine_samples(url, PROMPTS, group_size=2, max_new_tokens=12)
    assert max_log_prob_gap(trained, lora) <= 1e-5
    assert max_log_prob_gap(trained, base) > 1e-3  # the engine's base model is untouched


@pytest.mark.parametrize("arch", ["glm4_moe", "deepseek_v3"])
def test_glm_and_deepseek_attention_and_expert_adapters_load_with_peft(tiny_model_factory, arch, tmp_path):
    """The targets PEFT 0.21 can express on these models (docs/trainer.md, LoRA: not their dense MLP
    or shared experts, whose gate/up/down_proj it takes for the fused experts)."""
    from peft import PeftModel

    model_dir = tiny_model_factory(arch)
    trainer = lora_moe_trainer(model_dir, lora_target_modules=["linear_qkv", "linear_proj", *EXPERT_TARGETS])
    out = trainer.export_peft(tmp_path / "adapter")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    samples = random_samples(1, 3, seed=8)
    base_lps = hf_log_probs(base, samples)
    peft_model = PeftModel.from_pretrained(base, out).eval()
    ours = trainer.compute_log_probs(samples)
    for lp, ref, base_lp in zip(ours, hf_log_probs(peft_model, samples), base_lps, strict=True):
        torch.testing.assert_close(torch.tensor(lp), ref, rtol=0, atol=1e-4)
        assert not torch.allclose(torch.tensor(lp), base_lp, atol=1e-3)


def test_glm_shared_experts_and_dense_layer_get_adapters_and_the_engine_matches(
    engine_factory, tiny_model_factory, tmp_path
):
    """GLM-4.5: a dense first layer and a shared expert (`linear_fc1`/`linear_fc2`) besides the routed
    experts; the engine serves all of them."""
    model_dir = tiny_model_factory("glm4_moe")
    trainer = lora_moe_trainer(model_dir)
    names = {n.rsplit(".lora.", 1)[0] for n, p in trainer._policy().named_parameters() if p.requires_grad}
    assert {"decoder.layers.0.mlp.linear_fc1", "decoder.layers.1.mlp.shared_experts.linear_fc2"} <= names
    assert "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1" in names
    url = engine_factory(model_dir)
    with WeightSync(WeightSyncConfig(engine_urls=[url], method="disk", disk_dir=tmp_path)) as sync:
        sync.sync(trainer)
    lora, _ = engine_samples(url, PROMPTS, group_size=2, max_new_tokens=12, lora_path=LORA_ADAPTER_NAME)
    assert max_log_prob_gap(trainer, lora) <= 1e-5


def _ep_config(model: Path, ep: int) -> TrainerConfig:
    return TrainerConfig(model_path=model, lr=LR, lora_rank=2, micro_batch_tokens=1, expert_model_parallel_size=ep)


def _ep_samples():
    return random_samples(1, 5, seed=7, vocab=300)


def _ep_rank(rank: int, port: int, model: Path, out: Path) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")  # fmt: skip
    trainer = Trainer(_ep_config(model, ep=2), LossConfig())
    trainer.train_step(_ep_samples())
    trainer.export_peft(out / "adapter")  # a collective: every rank's experts' adapters
    torch.distributed.destroy_process_group()


def test_lora_under_expert_parallel_2_takes_the_step_one_rank_takes(moe_model, tmp_path):
    """Two gloo ranks, each holding two of the four experts and their adapters: the adapters start
    alike (seeded by whole-model name), and after one step the exported adapter is one rank's."""
    mp.spawn(_ep_rank, args=(free_port(), moe_model, tmp_path), nprocs=2, join=True)
    alone = Trainer(_ep_config(moe_model, ep=1), LossConfig())
    alone.train_step(_ep_samples())
    want = load_file(alone.export_peft(tmp_path / "alone") / "adapter_model.safetensors")
    got = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert set(got) == set(want) and any(".mlp.experts.lora_B" in k for k in got)
    for name, tensor in want.items():
        _assert_same_update(got[name], tensor, name)
