"""slime's trainer-side hooks with slime's signatures, called where slime calls them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slimeish.trainer.config import LossConfig, TrainerConfig
from slimeish.trainer.trainer import Trainer
from slimeish.trainer.weight_sync import WeightSync, WeightSyncConfig
from tests.trainer.trainer_helpers import random_samples

HERE = __name__
SEEN: dict[str, object] = {}


def first_sample_only(args, rollout_data):
    """slime's signature: per-token advantages set in place; +1 on each token of sample 0 only."""
    SEEN["rewards"], SEEN["group_size"] = rollout_data["rewards"], args.n_samples_per_prompt
    lengths = rollout_data["response_lengths"]
    rollout_data["advantages"] = [torch.full((r,), 1.0 if i == 0 else 0.0) for i, r in enumerate(lengths)]
    rollout_data["returns"] = rollout_data["advantages"]


def one_token_short(args, rollout_data):
    rollout_data["advantages"] = [torch.zeros(r - 1) for r in rollout_data["response_lengths"]]
    rollout_data["returns"] = rollout_data["advantages"]


def no_rollout_data(args):
    return None


def _trainer(tiny_model, path: str) -> Trainer:
    return Trainer(TrainerConfig(model_path=tiny_model, lr=1e-2),
                   LossConfig(custom_advantage_function_path=f"{HERE}.{path}"))  # fmt: skip


def test_a_custom_advantage_functions_values_are_the_ones_trained_on(tiny_model):
    trainer = _trainer(tiny_model, "first_sample_only")
    samples = random_samples(2, 2, seed=4)
    for s in samples:
        s.reward = 0.5  # equal rewards: GRPO's advantages would all be 0, so any change is the plugin's
    advantages = trainer.advantages(samples)
    assert advantages[0, : samples[0].response_length].tolist() == [1.0] * samples[0].response_length
    assert advantages[1:].abs().sum() == 0
    assert SEEN == {"rewards": [0.5] * 4, "group_size": 2}
    before = trainer.compute_log_probs(samples)
    trainer.train_step(samples)
    after = trainer.compute_log_probs(samples)
    assert sum(after[0]) > sum(before[0])  # the one sample with a positive advantage became likelier


def test_advantages_of_the_wrong_length_stop_the_step_naming_the_signature(tiny_model):
    trainer = _trainer(tiny_model, "one_token_short")
    with pytest.raises(ValueError, match="rollout_data"):
        trainer.train_step(random_samples(1, 2, seed=4))


def test_a_custom_advantage_function_with_the_wrong_signature_stops_the_trainer(tiny_model):
    with pytest.raises(ValueError, match="def custom_fn\\(args, rollout_data"):
        _trainer(tiny_model, "no_rollout_data")


def test_disabled_advantages_train_sft_samples_that_carry_no_reward(tiny_model):
    """slime's --disable-compute-advantages-and-returns (its SFT launch line): no reward is read."""
    samples = random_samples(1, 2, seed=6)
    for s in samples:
        s.reward = None
    with pytest.raises(ValueError, match="reward must be a number"):
        Trainer(TrainerConfig(model_path=tiny_model), LossConfig(loss_type="sft_loss")).train_step(samples)
    sft = Trainer(TrainerConfig(model_path=tiny_model), LossConfig(loss_type="sft_loss", compute_advantages=False))
    assert sft.train_step(samples)["loss"] > 0


def test_disabled_advantages_are_refused_for_the_policy_loss():
    with pytest.raises(ValueError, match="only --loss-type sft_loss"):
        LossConfig(compute_advantages=False)


def megatron_init(args):
    SEEN["init"] = (args.lr, args.loss_type, torch.distributed.is_initialized())


def before_log_prob(args, model, store_prefix):
    SEEN.setdefault("log_prob", []).append((store_prefix, model.training))


def before_train_step(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    """slime's usage: adjust the step from here. Zeroing the learning rate makes the step a no-op."""
    SEEN.setdefault("train_step", []).append((rollout_id, step_id, opt_param_scheduler))
    for group in optimizer.param_groups:
        group["lr"] = 0.0


def test_megatron_hooks_run_where_slime_runs_them(tiny_model):
    SEEN.clear()
    config = TrainerConfig(
        model_path=tiny_model, lr=5e-2, global_batch_size=4,
        custom_megatron_init_path=f"{HERE}.megatron_init",
        custom_megatron_before_log_prob_hook_path=f"{HERE}.before_log_prob",
        custom_megatron_before_train_step_hook_path=f"{HERE}.before_train_step",
    )  # fmt: skip
    trainer = Trainer(config, LossConfig())
    assert SEEN["init"] == (5e-2, "policy_loss", True)  # after the process group, with the options on args
    before = {k: v.clone() for k, v in trainer.hf_state_dict().items()}
    trainer.train_step(random_samples(2, 4, seed=7))  # two optimizer steps: pi_old is a forward-only pass
    assert SEEN["log_prob"] == [("", False)]
    assert SEEN["train_step"] == [(0, 0, None), (0, 1, None)]
    after = trainer.hf_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the hook's lr of 0 was the one stepped with


def mask_first_token_double_advantage(args, rollout_id, rollout_data):
    """slime's use: edit loss masks (and advantages) in place once the advantages are computed."""
    SEEN["postprocess"] = (rollout_id, args.n_samples_per_prompt, [a.clone() for a in rollout_data["advantages"]])
    for mask in rollout_data["loss_masks"]:
        mask[0] = 0
    rollout_data["advantages"] = [2 * a for a in rollout_data["advantages"]]


def test_a_rollout_data_postprocess_sets_the_masks_and_advantages_trained_on(tiny_model, monkeypatch):
    loss = LossConfig(rollout_data_postprocess_path=f"{HERE}.mask_first_token_double_advantage")
    trainer = Trainer(TrainerConfig(model_path=tiny_model, lr=0.0), loss)
    samples = random_samples(2, 2, seed=8)
    trained = {}
    real_step = trainer._optimizer_step

    def spy(batch, advantages, old, step_id):
        trained["masks"], trained["advantages"] = [s.loss_mask for s in batch], advantages.clone()
        return real_step(batch, advantages, old, step_id)

    monkeypatch.setattr(trainer, "_optimizer_step", spy)
    trainer.train_step(samples)
    rollout_id, group_size, before = SEEN["postprocess"]
    assert (rollout_id, group_size) == (0, 2)
    assert all(m[0] == 0 and all(m[1:]) for m in trained["masks"])
    grpo = trainer.advantages(samples)
    for i, s in enumerate(samples):
        assert torch.equal(before[i], grpo[i].expand(s.response_length))  # it saw the GRPO advantages
        assert torch.allclose(trained["advantages"][i, : s.response_length], 2 * grpo[i])


def publish(args, version_dir, rollout_engines):
    """slime's post-write hook: the files are there, the engines have not been told yet."""
    SEEN["post_write"] = (sorted(p.name for p in Path(version_dir).iterdir()), rollout_engines, args.method)


def test_a_post_write_hook_sees_a_disk_syncs_files_before_the_engines_load_them(tmp_path):
    class Exporter:
        lora = None  # a full fine-tuning run

        def export_hf(self, out_dir):
            Path(out_dir).mkdir(parents=True)
            (Path(out_dir) / "model.safetensors").write_text("")
            return Path(out_dir)

    config = WeightSyncConfig(engine_urls=["http://engine:1"], method="disk", disk_dir=tmp_path,
                              post_write_path=f"{HERE}.publish")  # fmt: skip
    with WeightSync(config) as sync:
        body, _ = sync._prepare(Exporter(), "3")  # what the engines are sent next: the same directory
    assert SEEN["post_write"] == (["model.safetensors"], ["http://engine:1"], "disk")
    assert body["model_path"] == str(tmp_path / "v3")
