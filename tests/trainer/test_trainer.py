"""Trainer mechanics on CPU: batching, schedule, steps, checkpoints and HF export."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from slimeish.trainer.batching import pack_micro_batches, split_global_batches
from slimeish.trainer.config import LossConfig, TrainerConfig
from slimeish.trainer.optimizer import lr_at
from slimeish.trainer.trainer import Trainer
from tests.trainer.trainer_helpers import random_samples


def test_packing_respects_token_budget_and_covers_every_sample():
    samples = random_samples(3, 4)
    batches = pack_micro_batches(samples, max_tokens=30)
    assert sorted(i for mb in batches for i in mb.indices) == list(range(len(samples)))
    for mb in batches:
        assert mb.num_tokens <= 30 or len(mb.indices) == 1
        for row, i in enumerate(mb.indices):
            s = samples[i]
            assert mb.input_ids[row, : len(s.tokens)].tolist() == s.tokens
            assert mb.loss_mask[row].sum().item() == s.response_length
            assert mb.response_start[row].item() == s.prompt_length - 1


def test_global_batches_must_divide():
    assert split_global_batches(random_samples(2, 2), 2) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="multiple"):
        split_global_batches(random_samples(1, 3), 2)


def test_lr_warmup_then_cosine(tiny_model):
    cfg = TrainerConfig(model_path=tiny_model, lr=1.0, min_lr=0.1, lr_warmup_steps=4, lr_decay_steps=10,
                        lr_decay_style="cosine")  # fmt: skip
    assert [lr_at(s, cfg) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(9, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(100, cfg) == pytest.approx(0.1)


@pytest.fixture(scope="module")
def trainer(tiny_model_factory):
    return Trainer(TrainerConfig(model_path=tiny_model_factory("llama"), lr=1e-3, micro_batch_tokens=40),
                   LossConfig(kl_coef=0.05, entropy_coef=0.01))  # fmt: skip


def test_step_metrics_and_version(trainer):
    samples = random_samples(2, 4, seed=1)
    before = {k: v.clone() for k, v in trainer.hf_state_dict().items()}
    metrics = trainer.train_step(samples)
    for key in ("loss", "pg_loss", "ref_kl", "entropy", "clip_fraction", "ppo_kl", "grad_norm", "lr"):
        assert math.isfinite(metrics[key]), key
    assert metrics["weight_version"] == trainer.weight_version == 1
    assert metrics["ref_kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first update
    after = trainer.hf_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_several_optimizer_steps_clip_against_the_old_policy(tiny_model):
    trainer = Trainer(TrainerConfig(model_path=tiny_model, lr=5e-2, global_batch_size=4),
                      LossConfig(eps_clip=0.01))  # fmt: skip
    metrics = trainer.train_step(random_samples(2, 4, seed=2))
    assert trainer.step == 2 and trainer.weight_version == 1
    assert metrics["clip_fraction"] > 0  # the second step's ratio is against the weights before the call


def test_save_load_resumes_exactly(trainer, tmp_path):
    samples = random_samples(2, 2, seed=3)
    trainer.save(tmp_path / "ckpt", data_state={"epoch": 1, "offset": 17})
    first = trainer.train_step(samples)
    state_after = trainer.hf_state_dict()
    assert trainer.load(tmp_path / "ckpt") == {"epoch": 1, "offset": 17}
    version = trainer.weight_version
    again = trainer.train_step(samples)
    assert trainer.weight_version == version + 1
    assert again["loss"] == pytest.approx(first["loss"], abs=1e-6)
    for k, v in trainer.hf_state_dict().items():
        torch.testing.assert_close(v, state_after[k], rtol=0, atol=1e-6)


def test_export_loads_with_from_pretrained_and_matches(trainer, tmp_path):
    out = trainer.export_hf(tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    samples = random_samples(1, 3, seed=4)
    ours = trainer.compute_log_probs(samples)
    for s, lp in zip(samples, ours, strict=True):
        with torch.no_grad():
            logits = hf(torch.tensor([s.tokens])).logits[0, :-1].log_softmax(-1)
        ref = logits.gather(-1, torch.tensor(s.tokens[1:]).unsqueeze(-1)).squeeze(-1)[-s.response_length :]
        torch.testing.assert_close(torch.tensor(lp), ref, rtol=0, atol=1e-4)


def test_bad_samples_are_rejected(trainer):
    bad = random_samples(1, 2)
    bad[0].reward = None
    with pytest.raises(ValueError, match="reward"):
        trainer.train_step(bad)
    with pytest.raises(ValueError, match="rollout_log_probs"):
        Trainer(TrainerConfig(model_path=trainer.config.model_path), LossConfig(tis=True)).train_step(
            random_samples(1, 2)
        )


@pytest.mark.parametrize(
    ("loss", "stat"),
    [
        (LossConfig(tis=True), "is_clip_fraction"),
        (LossConfig(icepop=True), "is_mask_fraction"),
        (LossConfig(tis=True, tis_mode="mask", tis_level="sequence"), "is_mask_fraction"),
    ],
)
def test_a_step_reports_its_off_policy_correction(tiny_model, loss, stat):
    """The engine's log-probs are the trainer's less 2 nats on every third response token, so those
    tokens' rho = e^2 = 7.4 lies beyond TIS's 2 and IcePop's 5: they are the clipped/masked ones. Per
    sequence every sample holds such a token (its first), so MIS masks all of them and nothing moves."""
    trainer = Trainer(TrainerConfig(model_path=tiny_model, lr=1e-3), loss)
    samples = random_samples(2, 3, seed=7)
    for s, log_p in zip(samples, trainer.compute_log_probs(samples), strict=True):
        s.rollout_log_probs = [x - 2.0 * (t % 3 == 0) for t, x in enumerate(log_p)]
    shifted = sum(len(range(0, s.response_length, 3)) for s in samples) / sum(s.response_length for s in samples)
    metrics = trainer.train_step(samples)
    sequence = loss.tis_level == "sequence"
    assert metrics[stat] == pytest.approx(1.0 if sequence else shifted)
    assert metrics["rollout_logprob_abs_diff_max"] == pytest.approx(2.0, abs=1e-4)
    assert metrics["rollout_logprob_abs_diff_mean"] == pytest.approx(2.0 * shifted, abs=1e-4)
    assert (metrics["grad_norm"] == 0.0) == sequence


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_micro_batching_gives_the_full_batch_gradient(tiny_model, aggregation):
    samples = random_samples(2, 3, seed=5)
    samples[0].loss_mask[0] = 0  # tokens the model did not sample carry no loss
    norms, tokens = [], []
    for budget in (16, 10_000):  # one sequence per micro-batch vs the whole batch at once
        trainer = Trainer(TrainerConfig(model_path=tiny_model, lr=0.0, micro_batch_tokens=budget),
                          LossConfig(loss_aggregation=aggregation))  # fmt: skip
        metrics = trainer.train_step(samples)
        norms.append(metrics["grad_norm"])
        tokens.append(metrics["tokens"])
    assert norms[0] == pytest.approx(norms[1], rel=1e-5)
    assert tokens[0] == tokens[1] == sum(sum(s.loss_mask) for s in samples)


def test_opd_moves_the_student_towards_a_teacher_surer_of_its_tokens(tiny_model):
    """Equal rewards (zero GRPO advantages): the whole signal is the OPD term. A teacher 1 nat surer
    of every sampled token makes the step raise their log-probs; a batch without teacher
    log-probs is refused."""
    trainer = Trainer(TrainerConfig(model_path=tiny_model, lr=1e-2, global_batch_size=8),
                      LossConfig(use_opd=True, opd_type="sglang", opd_kl_coef=1.0))  # fmt: skip
    samples = random_samples(2, 4, seed=3)
    with pytest.raises(ValueError, match="teacher_log_probs"):
        trainer.train_step(samples)
    before = trainer.compute_log_probs(samples)
    for s, lp in zip(samples, before, strict=True):
        s.reward, s.teacher_log_probs = 0.5, [x + 1.0 for x in lp]
    metrics = trainer.train_step(samples)
    assert metrics["opd_kl"] == pytest.approx(-1.0, abs=1e-4)
    after = trainer.compute_log_probs(samples)
    assert sum(map(sum, after)) > sum(map(sum, before))
