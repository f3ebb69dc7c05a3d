"""slime's loss hooks (--custom-loss-function-path, --custom-tis-function-path,
--custom-pg-loss-reducer-function-path) with slime's signatures, called where slime's loss calls them."""

from __future__ import annotations

import pytest
import torch

from slimeish.backends.megatron_utils.loss import get_log_probs_and_entropy
from slimeish.trainer.config import LossConfig, TrainerConfig
from slimeish.trainer.trainer import Trainer
from tests.trainer.trainer_helpers import random_samples

HERE = __name__
SEEN: dict[str, object] = {}


def nll_loss(args, batch, logits, sum_of_sample_mean):
    """slime's custom-loss signature, computing slime's sft_loss the way slime's own does."""
    SEEN["keys"] = set(batch)
    SEEN["lengths"] = (batch["total_lengths"], batch["response_lengths"], [len(a) for a in batch["advantages"]])
    SEEN["logits"] = tuple(logits.shape)
    _, out = get_log_probs_and_entropy(
        logits,
        args=args,
        unconcat_tokens=batch["unconcat_tokens"],
        total_lengths=batch["total_lengths"],
        response_lengths=batch["response_lengths"],
    )
    loss = -sum_of_sample_mean(torch.cat(out["log_probs"]))
    return loss, {"nll": loss.detach()}


def no_batch(args, logits):
    return None


def zero_weights(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
    """slime's TIS signature: every weight 0, so no policy-gradient token reaches the update."""
    SEEN["tis_args"] = (args.use_tis, args.my_threshold)  # a flag under slime's name, a custom config key
    SEEN["tis_lengths"] = [len(t) for t in train_log_probs], kwargs["response_lengths"]
    return pg_loss * 0, loss_masks, {"tis_seen": torch.ones_like(pg_loss)}


def vanilla_tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
    """slime's default TIS (clamp(exp(old - rollout), low, tis_clip)) as a plugin."""
    ratio = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs))
    return pg_loss * ratio.clamp(args.tis_clip_low, args.tis_clip), loss_masks, {}


def reject_first_tokens(args, *, pg_loss, loss_masks, **kwargs):
    """slime's rejection sampling through the returned masks: each sample's first token is rejected."""
    return pg_loss, [torch.cat([m[:1] * 0, m[1:]]) for m in loss_masks], {}


def unit_advantages(args, rollout_data):
    """Every token's advantage 1, so each sample's policy loss is -1 per token (ratio 1)."""
    rollout_data["advantages"] = [torch.ones(r) for r in rollout_data["response_lengths"]]
    rollout_data["returns"] = rollout_data["advantages"]


def keep_first_tokens(args, *, pg_loss, loss_masks, **kwargs):
    return pg_loss, [torch.cat([m[:1], m[1:] * 0]) for m in loss_masks], {}


def first_sample_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
    """slime's reducer signature: only sample 0's tokens count."""
    SEEN["reducer"] = calculate_per_token_loss

    def reduce(x):
        return (x.split(response_lengths)[0] * loss_masks[0]).sum()

    return reduce


def token_sum_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
    def reduce(x):
        return torch.stack(
            [(x_i * m).sum() for x_i, m in zip(x.split(response_lengths), loss_masks, strict=True)]
        ).sum()

    return reduce


def _samples(seed: int = 4):
    samples = random_samples(2, 2, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    for s in samples:
        s.rollout_log_probs = (-torch.rand(s.response_length, generator=gen) - 2.0).tolist()
    return samples


def _trained(tiny_model, hook_args=None, **loss) -> tuple[Trainer, dict[str, float]]:
    trainer = Trainer(TrainerConfig(model_path=tiny_model, lr=1e-2), LossConfig(**loss), hook_args)
    return trainer, trainer.train_step(_samples())


def _params(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b, strict=True))


def test_a_custom_loss_is_the_update(tiny_model):
    """slime's sft_loss written as a custom loss trains exactly as the built-in sft_loss."""
    custom, metrics = _trained(tiny_model, loss_type="custom_loss", custom_loss_function_path=f"{HERE}.nll_loss",
                               compute_advantages=False)  # fmt: skip
    sft, sft_metrics = _trained(tiny_model, loss_type="sft_loss", compute_advantages=False)
    assert metrics["loss"] == pytest.approx(sft_metrics["loss"], rel=1e-5)
    assert metrics["nll"] == pytest.approx(sft_metrics["loss"], rel=1e-5)  # its metric, over the same normaliser
    assert _same(_params(custom), _params(sft))
    initial = _params(Trainer(TrainerConfig(model_path=tiny_model), LossConfig()))
    assert not _same(_params(custom), initial)
    assert {"unconcat_tokens", "loss_masks", "advantages", "log_probs", "rollout_log_probs"} <= SEEN["keys"]
    totals, responses, advantages = SEEN["lengths"]
    assert responses == advantages and SEEN["logits"][:2] == (1, sum(totals))  # packed, no padding


def test_a_custom_loss_needs_its_loss_type_and_slimes_signature(tiny_model):
    with pytest.raises(ValueError, match="custom_loss and --custom-loss-function-path go together"):
        LossConfig(custom_loss_function_path=f"{HERE}.nll_loss")
    with pytest.raises(ValueError, match="go together"):
        LossConfig(loss_type="custom_loss")
    with pytest.raises(ValueError, match=r"def loss\(args, batch"):
        _trained(tiny_model, loss_type="custom_loss", custom_loss_function_path=f"{HERE}.no_batch")


def test_a_tis_functions_weights_reach_the_loss(tiny_model):
    """Zero weights leave the weights where they were; the hook sees slime's names and the custom config."""
    base = dict(tis=True, custom_tis_function_path=f"{HERE}.zero_weights")
    trainer, metrics = _trained(tiny_model, {"my_threshold": 3}, **base)
    initial = _params(Trainer(TrainerConfig(model_path=tiny_model), LossConfig()))
    assert _same(_params(trainer), initial)
    assert metrics["tis_seen"] == pytest.approx(1.0)  # its metric: a per-sample mean of ones, per sample
    assert SEEN["tis_args"] == (True, 3)
    lengths, responses = SEEN["tis_lengths"]
    assert lengths == responses
    untouched, _ = _trained(tiny_model, loss_type="policy_loss")
    assert not _same(_params(untouched), initial)


def test_slimes_default_tis_as_a_plugin_trains_as_the_built_in_one(tiny_model):
    plugin, metrics = _trained(tiny_model, tis=True, custom_tis_function_path=f"{HERE}.vanilla_tis")
    built_in, built_in_metrics = _trained(tiny_model, tis=True)
    assert metrics["loss"] == pytest.approx(built_in_metrics["loss"], rel=1e-5)
    assert _same(_params(plugin), _params(built_in))


def test_a_tis_functions_masks_reject_tokens_from_the_numerator_only(tiny_model):
    """Rejected tokens leave the sum; the per-sample denominators stay the original masks' (slime), so
    the two halves of a split add up to the whole (with the kept masks as denominators they would not)."""
    ones = {"loss_aggregation": "sequence", "custom_advantage_function_path": f"{HERE}.unit_advantages"}
    rest, first = (
        _trained(tiny_model, tis=True, custom_tis_function_path=f"{HERE}.{fn}", **ones)[1]
        for fn in ("reject_first_tokens", "keep_first_tokens")
    )
    _, plain = _trained(tiny_model, **ones)
    assert plain["loss"] == pytest.approx(-1.0)
    assert rest["loss"] != pytest.approx(plain["loss"])
    assert rest["loss"] + first["loss"] == pytest.approx(plain["loss"], rel=1e-5)


def test_a_tis_function_needs_tis(tiny_model):
    with pytest.raises(ValueError, match="give --tis"):
        LossConfig(custom_tis_function_path=f"{HERE}.zero_weights")
    with pytest.raises(ValueError, match=r"def tis\(args, \*, pg_loss"):
        _trained(tiny_model, tis=True, custom_tis_function_path=f"{HERE}.first_sample_reducer")


def test_a_reducer_changes_the_reduction(tiny_model):
    """Only sample 0 counts: the update equals the policy loss on sample 0 alone, token-summed."""
    trainer = Trainer(TrainerConfig(model_path=tiny_model, lr=1e-2),
                      LossConfig(custom_pg_loss_reducer_function_path=f"{HERE}.first_sample_reducer"))  # fmt: skip
    samples = _samples()
    metrics = trainer.train_step(samples)
    assert SEEN["reducer"] is True  # --loss-aggregation token is slime's --calculate-per-token-loss
    plain, plain_metrics = _trained(tiny_model)
    assert metrics["loss"] != pytest.approx(plain_metrics["loss"])
    assert not _same(_params(trainer), _params(plain))


def test_slimes_token_sum_reducer_trains_as_token_aggregation(tiny_model):
    plugin, metrics = _trained(tiny_model, custom_pg_loss_reducer_function_path=f"{HERE}.token_sum_reducer")
    plain, plain_metrics = _trained(tiny_model)
    assert metrics["loss"] == pytest.approx(plain_metrics["loss"], rel=1e-5)
    assert _same(_params(plugin), _params(plain))


def test_a_reducer_reduces_the_policy_loss_only():
    with pytest.raises(ValueError, match="reduces the policy loss"):
        LossConfig(loss_type="sft_loss", custom_pg_loss_reducer_function_path=f"{HERE}.token_sum_reducer")
