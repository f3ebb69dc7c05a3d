"""Group rules (pure): failed members, staleness bound, filter hook, the built-in DAPO filter."""

from __future__ import annotations

import pytest

from slimeish.buffer import BufferConfig
from slimeish.buffer.filters import nonzero_reward_variance
from slimeish.buffer.rules import Member, judge
from slimeish.common.sample import Sample, Status

OK, FAILED = Status.COMPLETED, Status.FAILED


def member(status: Status = OK, reward: float = 1.0, versions: tuple[int, ...] = (5,), index: int = 0) -> Member:
    samples = [] if status is FAILED else [Sample(reward=reward, weight_versions=list(versions))]
    return Member(index, f"s{index}", status, samples)


def test_complete_group_is_trainable():
    verdict = judge("g", [member(reward=0.0), member(reward=1.0)], BufferConfig(), current_version=5)
    assert verdict.keep and len(verdict.samples) == 2


def test_failed_member_drops_group_by_default():
    assert judge("g", [member(), member(FAILED)], BufferConfig(), None).state == "dropped_failed"


def test_keep_successful_needs_min_successful():
    config = BufferConfig(failed_policy="keep_successful", min_successful=2)
    kept = judge("g", [member(), member(), member(FAILED)], config, None)
    assert kept.keep and len(kept.samples) == 2
    assert judge("g", [member(), member(FAILED), member(FAILED)], config, None).state == "dropped_failed"


def test_staleness_is_judged_per_member_from_its_oldest_token():
    config = BufferConfig(max_staleness=2)
    group = [member(versions=(3, 5), index=0), member(versions=(5,), index=1), member(versions=(4,), index=2)]
    assert judge("g", group, config, current_version=5).keep  # 5 - 3 = 2: at the bound
    verdict = judge("g", group, config, current_version=6)
    assert verdict.state == "reopen" and [m.index for m in verdict.stale] == [0]
    assert verdict.oldest_version == 3 and verdict.samples == []
    assert [m.index for m in judge("g", group, config, current_version=11).stale] == [0, 1, 2]
    assert judge("g", group, BufferConfig(), current_version=100).keep  # no bound configured


def test_a_group_reopened_max_regenerations_times_is_dropped_when_still_stale():
    config = BufferConfig(max_staleness=0, max_regenerations=2)
    group = [member(versions=(1,), index=0), member(versions=(2,), index=1)]
    assert judge("g", group, config, current_version=2, reopened=1).state == "reopen"
    assert judge("g", group, config, current_version=2, reopened=2).state == "dropped_stale"
    assert judge("g", [member(versions=(2,), index=0)], config, current_version=2, reopened=2).keep


def test_members_from_discarded_weights_are_stale_even_without_a_bound():
    """After a resume from an earlier checkpoint, tokens sampled by weights the trainer no longer has."""
    group = [member(versions=(3, 4), index=0), member(versions=(3,), index=1)]
    verdict = judge("g", group, BufferConfig(), current_version=3)
    assert verdict.state == "reopen" and [m.index for m in verdict.stale] == [0]
    assert judge("g", group, BufferConfig(), current_version=4).keep
    assert judge("g", group, BufferConfig(), current_version=None).keep  # no version given: no judgement


def test_tokens_from_weights_a_resume_discarded_are_stale_though_their_versions_come_again():
    from slimeish.buffer.rules import Resume

    resumes = [Resume(at=100.0, version=3)]  # resumed at t=100 from a checkpoint of version 3
    before = Member(0, "old", OK, [Sample(weight_versions=[4])], created_at=90.0)  # the killed run's version 4
    after = Member(1, "new", OK, [Sample(weight_versions=[4])], created_at=110.0)  # this run's version 4
    kept = Member(2, "base", OK, [Sample(weight_versions=[3])], created_at=80.0)  # the checkpoint's own weights
    verdict = judge("g", [before, after, kept], BufferConfig(), current_version=5, resumes=resumes)
    assert verdict.state == "reopen" and [m.index for m in verdict.stale] == [0]


def test_failed_members_are_not_regenerated():
    config = BufferConfig(max_staleness=0, failed_policy="keep_successful")
    verdict = judge("g", [member(versions=(1,), index=0), member(FAILED, index=1)], config, current_version=2)
    assert [m.index for m in verdict.stale] == [0]


def test_filter_hook_and_builtin_zero_variance_filter():
    same = [member(reward=1.0), member(reward=1.0)]
    assert judge("g", same, BufferConfig(), None, nonzero_reward_variance).state == "filtered"
    assert judge("g", [member(reward=0.0), member(reward=1.0)], BufferConfig(), None, nonzero_reward_variance).keep
    with pytest.raises(ValueError, match="scalar"):
        nonzero_reward_variance("g", [Sample(reward=None)])


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="min_successful"):
        BufferConfig(min_successful=0)
    with pytest.raises(ValueError, match="max_staleness"):
        BufferConfig(max_staleness=-1)
    with pytest.raises(ValueError, match="max_regenerations"):
        BufferConfig(max_regenerations=-1)
