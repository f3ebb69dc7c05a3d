"""A step's `episodes/` metrics merged from several rollout calls (async mode runs one per group;
sync mode calls again for filtered, failed or stale groups): the merge gives what one call over
all the calls' episodes would have reported."""

import pytest

from slimeish.common.sample import Sample, Status
from slimeish.rollout.episode_metrics import merged
from slimeish.rollout_functions.sessions import rollout_output


def _group(rewards: list[float | None], statuses: list[Status]) -> list[Sample]:
    return [Sample(index=i, reward=r, status=s) for i, (r, s) in enumerate(zip(rewards, statuses, strict=True))]


def test_calls_merge_to_what_one_call_over_all_their_episodes_reports():
    done, failed, truncated = Status.COMPLETED, Status.FAILED, Status.TRUNCATED
    groups = [
        _group([1.0, 0.0, 0.5], [done, done, truncated]),
        _group([0.25, None, 2.0], [done, failed, done]),
        _group([None, None, None], [failed, failed, failed]),  # no reward: must not weigh in the mean
        _group([-1.0, 3.0, 0.0], [done, done, done]),
    ]
    per_call = [rollout_output([g], evaluation=False).metrics for g in groups]
    whole = rollout_output(groups, evaluation=False).metrics
    assert merged(per_call) == pytest.approx(whole, rel=1e-12, abs=1e-12)
    assert whole["failed"] == 4 and whole["episodes"] == 12 and whole["rewarded"] == 8  # the case is not trivial


def test_counts_sum_other_keys_average_and_one_call_is_kept_as_returned():
    calls = [
        {"harness_sandbox_failed": 1.0, "turns": 4.0, "tool_count": 2.0},
        {"harness_sandbox_failed": 2.0, "turns": 6.0, "tool_count": 3.0, "x": 1.0},
    ]
    assert merged(calls) == {"harness_sandbox_failed": 3.0, "turns": 5.0, "tool_count": 5.0, "x": 1.0}
    one = {"reward_mean": 0.7, "reward_std": 0.3, "rewarded": 2.0}
    assert merged([one]) == one and merged([]) == {}


def test_reward_stats_without_their_count_are_averaged_and_non_numbers_keep_the_last():
    calls = [{"reward_mean": 1.0, "note": "a"}, {"reward_mean": 0.0, "note": "b"}]  # a custom function's
    assert merged(calls) == {"reward_mean": 0.5, "note": "b"}
