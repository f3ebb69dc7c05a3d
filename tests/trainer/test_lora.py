"""LoRA in the Megatron trainer on CPU: frozen base, adapter-only steps, checkpoints, PEFT and merged exports."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from slimeish.trainer.config import TrainerConfig
from slimeish.trainer.hf_io import megatron_params
from slimeish.trainer.trainer import Trainer
from tests.trainer.trainer_helpers import random_samples


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
