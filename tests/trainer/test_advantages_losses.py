"""Each advantage estimator, loss, penalty and reduction against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from slimeish.trainer import losses as L
from slimeish.trainer.advantages import group_normalized_advantages
from slimeish.trainer.config import LossConfig


def test_grpo_advantages_by_hand():
    # group 0: rewards 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3); group 1: 2 and 4 -> mean 3, std sqrt(2)
    adv = group_normalized_advantages(torch.tensor([1.0, 0.0, 2.0, 0.0, 1.0, 4.0]), [0, 0, 1, 0, 0, 1], eps=0.0)
    s0, s1 = math.sqrt(1 / 3), math.sqrt(2)
    want = [0.5 / s0, -0.5 / s0, -1 / s1, -0.5 / s0, 0.5 / s0, 1 / s1]
    torch.testing.assert_close(adv, torch.tensor(want))


def test_dr_grpo_keeps_scale_and_singleton_group_is_zero():
    adv = group_normalized_advantages(torch.tensor([1.0, 0.0, 0.0, 5.0]), [0, 0, 0, 1], normalize_std=False)
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0]))


def test_uniform_group_has_zero_advantage():
    adv = group_normalized_advantages(torch.tensor([1.0, 1.0, 1.0]), [7, 7, 7])
    assert torch.equal(adv, torch.zeros(3))


def test_ppo_clip_clip_higher_and_dual_clip():
    ratio = torch.tensor([0.5, 1.1, 1.5, 1.5, 5.0])
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0])
    loss, clipped = L.ppo_clip_loss(ratio, adv, eps_clip=0.2, eps_clip_high=0.28, dual_clip_c=None)
    # A>0: max(-r, -clip(r)): r=0.5 -> max(-0.5, -0.8) = -0.5 (not clipped); r=1.5 -> -1.28 (clipped)
    # A<0: max(r, clip(r)): r=1.5 -> 1.5; r=5 -> 5
    torch.testing.assert_close(loss, torch.tensor([-0.5, -1.1, -1.28, 1.5, 5.0]))
    torch.testing.assert_close(clipped, torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0]))
    loss, clipped = L.ppo_clip_loss(ratio, adv, eps_clip=0.2, eps_clip_high=0.28, dual_clip_c=3.0)
    torch.testing.assert_close(loss, torch.tensor([-0.5, -1.1, -1.28, 1.5, 3.0]))  # 5 bounded by c * |A| = 3
    torch.testing.assert_close(clipped, torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0]))


def test_ppo_gradient_is_zero_on_clipped_tokens():
    logp = torch.log(torch.tensor([0.6, 0.3])).requires_grad_()
    old = torch.log(torch.tensor([0.4, 0.3]))
    loss, _ = L.ppo_clip_loss((logp - old).exp(), torch.tensor([1.0, 1.0]), 0.2, 0.2, None)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, -1.0]))  # ratio 1.5 clipped; ratio 1 -> -A r


def test_gspo_ratio_is_sequence_level():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, -2.0], [-2.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    log_ratio = L.gspo_log_ratio(logp, old, mask)
    # sequence means of log(pi/pi_old): (0.5 + 0 - 1) / 3 = -1/6 and (1 + 0) / 2 = 0.5, on every token
    torch.testing.assert_close(log_ratio, torch.tensor([[-1 / 6] * 3, [0.5] * 3]))
    log_ratio.sum().backward()
    assert torch.equal(logp.grad, torch.ones_like(logp))  # gradient of log pi itself


def test_cispo_weight_is_clipped_and_detached():
    logp = torch.log(torch.tensor([0.9, 0.5])).requires_grad_()
    old = torch.log(torch.tensor([0.5, 0.5]))
    adv = torch.tensor([2.0, -1.0])
    loss, clipped = L.cispo_loss(logp, old, adv, eps_clip=0.2, eps_clip_high=0.28)
    # ratio 1.8 -> weight 1.28, ratio 1 -> weight 1: loss = -w A log pi
    torch.testing.assert_close(loss, torch.tensor([-1.28 * 2 * math.log(0.9), 1 * math.log(0.5)]))
    torch.testing.assert_close(clipped, torch.tensor([1.0, 0.0]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([-2.56, 1.0]))  # clipped token keeps its gradient


@pytest.mark.parametrize(
    ("kind", "want"),
    [("k1", [0.5, -1.0]), ("k2", [0.125, 0.5]), ("k3", [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0])],
)
def test_kl_estimators(kind, want):
    kl = L.kl_penalty(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0]), kind)
    torch.testing.assert_close(kl, torch.tensor(want))


def test_entropy_of_uniform_and_peaked():
    ent = L.entropy_from_logits(torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, -1e9, -1e9, -1e9]]))
    torch.testing.assert_close(ent, torch.tensor([math.log(4), 0.0]))


def test_rollout_log_ratio_per_token_and_per_sequence():
    old = torch.tensor([[-1.0, -1.0, -1.0], [-0.5, -2.0, 0.0]])
    rollout = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the last token is not trained: not in the product
    token = L.rollout_log_ratio(old, rollout, mask, "token")
    torch.testing.assert_close(token, torch.tensor([[0.0, 1.0, -0.5], [0.5, -1.0, 0.0]]))
    sequence = L.rollout_log_ratio(old, rollout, mask, "sequence")
    torch.testing.assert_close(sequence, torch.tensor([[0.5] * 3, [-0.5] * 3]))


def test_truncated_importance_weights():
    w, clipped = L.importance_weights(torch.tensor([0.0, 1.0, -0.5]), 0.0, 2.0, "truncate")
    torch.testing.assert_close(w, torch.tensor([1.0, 2.0, math.exp(-0.5)]))  # e^1 truncated to 2
    assert clipped.tolist() == [0.0, 1.0, 0.0]
    w, clipped = L.importance_weights(torch.tensor([0.0, 1.0, -0.5]), 0.7, 2.0, "truncate")
    torch.testing.assert_close(w, torch.tensor([1.0, 2.0, 0.7]))  # e^-0.5 = 0.61 raised to 0.7
    assert clipped.tolist() == [0.0, 1.0, 1.0]


def test_masked_importance_weights_drop_tokens_outside_the_band():
    w, masked = L.importance_weights(torch.tensor([0.0, 1.0, -0.5, -1.0]), 0.5, 2.0, "mask")
    torch.testing.assert_close(w, torch.tensor([1.0, 0.0, math.exp(-0.5), 0.0]))  # e = 2.72 > 2, e^-1 = 0.37 < 0.5
    assert masked.tolist() == [0.0, 1.0, 0.0, 1.0]


def test_sequence_weights_stay_finite_where_the_product_overflows():
    log_ratio = torch.tensor([[200.0, 200.0], [0.25, 0.25]])  # e^200 is inf in float32
    w, clipped = L.importance_weights(log_ratio, 0.0, 2.0, "truncate")
    torch.testing.assert_close(w, torch.tensor([[2.0, 2.0], [math.exp(0.25)] * 2]))
    assert clipped.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    w, masked = L.importance_weights(log_ratio, 0.0, 2.0, "mask")
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0], [math.exp(0.25)] * 2]))
    assert masked.tolist() == [[1.0, 1.0], [0.0, 0.0]]


@pytest.mark.parametrize(
    ("cfg", "weights", "stat", "fraction"),
    [
        # log rho per token: 0, 1, -0.5 and, on the untrained 4th token, 0 (its rollout log-prob is ignored);
        # per sequence: 0.5, the sum over the trained three
        (LossConfig(tis=True), [1.0, 2.0, math.exp(-0.5), 1.0], "is_clip_fraction", 1 / 3),
        (LossConfig(tis=True, tis_mode="mask"), [1.0, 0.0, math.exp(-0.5), 1.0], "is_mask_fraction", 1 / 3),
        (LossConfig(tis=True, tis_level="sequence"), [math.exp(0.5)] * 4, "is_clip_fraction", 0.0),
        (LossConfig(tis=True, tis_level="sequence", tis_clip_high=1.5), [1.5] * 4, "is_clip_fraction", 1.0),
        (
            LossConfig(tis=True, tis_mode="mask", tis_level="sequence", tis_clip_high=1.5),
            [0.0] * 4,
            "is_mask_fraction",
            1.0,
        ),
        # IcePop's band [0.5, 5] keeps e = 2.7 and e^-0.5 = 0.61; raising alpha to 0.7 masks the latter
        (LossConfig(icepop=True), [1.0, math.e, math.exp(-0.5), 1.0], "is_mask_fraction", 0.0),
        (LossConfig(icepop=True, icepop_low=0.7), [1.0, math.e, 0.0, 1.0], "is_mask_fraction", 1 / 3),
    ],
)
def test_off_policy_corrections_by_config(cfg, weights, stat, fraction):
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    rollout = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w, stats = L.off_policy_correction(cfg, old, rollout, mask)
    torch.testing.assert_close(w, torch.tensor([weights]))
    assert set(stats) == {stat} and stats[stat].item() == pytest.approx(fraction)


def test_a_masked_token_gets_no_gradient():
    """PPO at ratio 1 with A = 1: d loss / d log pi = -w per token, so IcePop's masked token gets 0."""
    log_p = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)
    rollout = torch.tensor([[-1.0, -3.0, -1.5]])  # rho = 1, e^2 (masked), e^0.5
    mask, adv = torch.ones(1, 3), torch.ones(1, 3)
    cfg = LossConfig(icepop=True)
    per_token, _ = L.policy_loss(cfg, log_p, log_p.detach(), adv, mask)
    w, _ = L.off_policy_correction(cfg, log_p.detach(), rollout, mask)
    L.aggregate(per_token * w, mask, "token", normalizer=1.0).backward()
    assert log_p.grad is not None
    torch.testing.assert_close(log_p.grad, torch.tensor([[-1.0, 0.0, -math.exp(0.5)]]))


def test_token_and_sequence_aggregation():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(L.aggregate(per_token, mask, "token", 4.0), torch.tensor(10 / 4))
    torch.testing.assert_close(L.aggregate(per_token, mask, "sequence", 2.0), torch.tensor((2.0 + 4.0) / 2))


def test_policy_loss_dispatch_and_stats():
    logp = torch.log(torch.tensor([[0.5, 0.9]]))
    old = torch.log(torch.tensor([[0.5, 0.5]]))
    adv, mask = torch.tensor([[1.0, 1.0]]), torch.ones(1, 2)
    loss, stats = L.policy_loss(LossConfig(eps_clip=0.2), logp, old, adv, mask)
    torch.testing.assert_close(loss, torch.tensor([[-1.0, -1.2]]))
    assert stats["clip_fraction"].item() == pytest.approx(0.5)
    assert stats["ppo_kl"].item() == pytest.approx(-math.log(1.8) / 2)


def test_loss_config_rejects_bad_values():
    with pytest.raises(ValueError):
        LossConfig(dual_clip_c=0.5)
    with pytest.raises(ValueError):
        LossConfig(tis=True, old_log_probs="rollout")
    with pytest.raises(ValueError, match="icepop"):
        LossConfig(icepop=True, old_log_probs="rollout")
    with pytest.raises(ValueError, match="choose one"):
        LossConfig(tis=True, icepop=True)
    with pytest.raises(ValueError, match="icepop_low"):
        LossConfig(icepop=True, icepop_low=0.0)
    with pytest.raises(ValueError, match="tis_clip_high > 0"):
        LossConfig(tis=True, tis_clip_high=0.0)


def test_split_episode_counts_once_in_its_group_baseline():
    # Group of 3 episodes with rewards 1, 0, 0; episode "a" was split into 3 segments.
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0])
    adv = group_normalized_advantages(rewards, [0] * 5, member_ids=["a", "a", "a", "b", "c"], eps=0.0)
    mean, std = 1 / 3, torch.tensor([1.0, 0.0, 0.0]).std()
    expected = torch.tensor([1 - mean] * 3 + [-mean] * 2) / std
    torch.testing.assert_close(adv, expected)
    # Counting each segment as a member would give a different (biased) baseline.
    assert not torch.allclose(adv, group_normalized_advantages(rewards, [0] * 5, eps=0.0))


def test_sft_loss_is_the_nll_of_the_trained_tokens_and_ignores_advantages():
    log_p = torch.tensor([[-0.5, -2.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    cfg = LossConfig(loss_type="sft_loss")
    per_token, stats = L.policy_loss(cfg, log_p, torch.zeros(1, 3), torch.full((1, 3), 9.0), mask)
    loss = L.aggregate(per_token, mask, "token", normalizer=2.0)
    assert loss.item() == pytest.approx(1.25) and stats == {}
    loss.backward()
    assert log_p.grad is not None and log_p.grad.tolist() == [[-0.5, -0.5, 0.0]]  # raises the targets' likelihood
    with pytest.raises(ValueError, match="drop --tis"):
        LossConfig(loss_type="sft_loss", tis=True)
    with pytest.raises(ValueError, match="--icepop"):
        LossConfig(loss_type="sft_loss", icepop=True)


def test_opd_lowers_each_advantage_by_the_reverse_kl_and_its_gradient_follows():
    """slime's OPD: A'_t = A - coef (log pi_old(y_t) - log pi_teacher(y_t)); through the PPO loss at
    ratio 1 the gradient of the per-token loss w.r.t. log pi is -A'_t."""
    log_p = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    teacher = torch.tensor([[-1.5, -1.0, -0.5]])
    adv = torch.full((1, 3), 0.25)
    new_adv, reverse_kl = L.opd_advantages(adv, log_p.detach(), teacher, coef=0.5)
    torch.testing.assert_close(reverse_kl, torch.tensor([[0.5, -1.0, 0.0]]))
    torch.testing.assert_close(new_adv, torch.tensor([[0.0, 0.75, 0.25]]))
    cfg = LossConfig(use_opd=True, opd_type="sglang", opd_kl_coef=0.5)
    per_token, _ = L.policy_loss(cfg, log_p, log_p.detach(), new_adv, torch.ones(1, 3))
    per_token.sum().backward()
    assert log_p.grad is not None
    torch.testing.assert_close(log_p.grad, -new_adv)
    # the teacher's log-prob never gets a gradient path, nor does pi_old's
    assert not reverse_kl.requires_grad


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"use_opd": True}, "--opd-type sglang"),
        ({"use_opd": True, "opd_type": "megatron"}, "slimeish engine --model TEACHER"),
        ({"use_opd": True, "opd_type": "sglang", "loss_type": "sft_loss"}, "sft_loss has none"),
    ],
)
def test_opd_config_refuses_what_it_cannot_train(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        LossConfig(**kwargs)
