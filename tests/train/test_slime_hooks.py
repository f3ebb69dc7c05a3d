"""slime's hook contracts: the dynamic sampling filter (checked at start-up, strict about its
return type, dropping zero-variance groups with a counted reason) and a rollout function that
returns a bare list of groups."""

import argparse

import pytest

from slimeish.buffer import BufferConfig
from slimeish.buffer.rules import Member, judge
from slimeish.common.sample import Sample
from slimeish.rollout import GENERATE_SIGNATURE, RolloutFnEvalOutput, RolloutFnTrainOutput, generated_samples
from slimeish.rollout.dynamic_filter import DYNAMIC_FILTER_SIGNATURE, DynamicFilter
from slimeish.rollout.filter_hub.base_types import DynamicFilterOutput
from slimeish.rollout_functions.sessions import _member
from slimeish.train.producer import eval_output, train_output
from slimeish.train.setup import check_plugins, parse_args

HUB = "slimeish.rollout.filter_hub.dynamic_sampling_filters"
ARGS = argparse.Namespace(reward_key=None)


def keep_all_as_bool(args, samples, **kwargs):
    return True  # slime's legacy shape: refused here, it would hide a wrong filter


def keep_only_long(args, samples, **kwargs):
    keep = any(s.response_length > 2 for s in samples)
    return DynamicFilterOutput(keep=keep, reason=None if keep else "short")


def group(*rewards: float) -> list[Sample]:
    return [Sample(index=i, reward=r) for i, r in enumerate(rewards)]


def test_zero_variance_groups_are_dropped_and_counted_by_reason():
    f = DynamicFilter(f"{HUB}.check_reward_nonzero_std", ARGS)
    assert f("g0", group(1.0, 0.0)) is True
    assert f("g1", group(1.0, 1.0)) is False and f("g2", group(0.0, 0.0)) is False
    assert f("g3", group(0.0, 0.0)) is False
    assert f.metrics() == {
        "rollout/dynamic_filter/drop_zero_std_1.0": 1.0,
        "rollout/dynamic_filter/drop_zero_std_0.0": 2.0,
    }
    assert f.metrics() == {}  # counted once


def test_fallback_filter_keeps_a_group_that_would_leave_the_batch_short():
    f = DynamicFilter(f"{HUB}.check_reward_nonzero_std_with_fallback", ARGS)
    assert f("g0", group(1.0, 1.0)) is True and f.metrics() == {}


def test_a_user_filter_in_slimes_style_runs():
    f = DynamicFilter(f"{__name__}.keep_only_long", ARGS)
    assert f("g0", [Sample(response_length=3)]) and not f("g1", [Sample(response_length=1)])
    assert f.metrics() == {"rollout/dynamic_filter/drop_short": 1.0}


def test_a_filter_returning_the_wrong_type_stops_the_run_at_start_up(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a", "label": "a"}\n')
    argv = ["--model-path", str(tmp_path), "--prompt-data", str(prompts)]
    setup = parse_args([*argv, "--dynamic-sampling-filter-path", f"{__name__}.keep_all_as_bool"])
    with pytest.raises(TypeError, match="returned bool") as exc:
        check_plugins(setup)
    assert DYNAMIC_FILTER_SIGNATURE in str(exc.value)
    setup = parse_args([*argv, "--dynamic-sampling-filter-path", f"{HUB}.check_reward_nonzero_std"])
    check_plugins(setup)  # slime's own filter passes


def test_the_buffer_refuses_a_filter_verdict_that_is_not_a_bool():
    member = Member(0, "s0", Sample.Status.COMPLETED, group(1.0, 0.0), 0.0)
    with pytest.raises(TypeError, match="expected a bool"):
        judge("g0", [member], BufferConfig(), None, lambda gid, samples: DynamicFilterOutput(keep=False))


def test_a_rollout_function_may_return_a_bare_list_of_groups():
    groups = [group(1.0, 0.0)]
    assert train_output(groups) == RolloutFnTrainOutput(samples=groups)
    with pytest.raises(TypeError, match="expected RolloutFnTrainOutput or a list of groups"):
        train_output({"samples": groups})


def test_an_evaluation_may_return_a_bare_dict_of_datasets():
    data = {"math": {"rewards": [1.0, 0.0]}}
    assert eval_output(data) == RolloutFnEvalOutput(data=data)
    assert eval_output(RolloutFnEvalOutput(data=data, metrics={"x": 1.0})).metrics == {"x": 1.0}
    for wrong in ([group(1.0)], {"math": [1.0]}, {"math": {"scores": [1.0]}}):
        with pytest.raises(TypeError, match="for evaluation; expected RolloutFnEvalOutput"):
            eval_output(wrong)


def test_a_generate_function_may_return_a_sample_or_a_list_and_nothing_else():
    one, two = Sample(index=0), Sample(index=0)
    assert generated_samples(one, "gen") == [one]
    assert generated_samples([one, two], "gen") == [one, two]
    for wrong in (None, True, {"tokens": []}, [], [one, "x"]):
        with pytest.raises(TypeError, match="gen returned") as exc:
            generated_samples(wrong, "gen")
        assert GENERATE_SIGNATURE in str(exc.value)


def test_a_returned_list_with_differing_rewards_fails_its_member_saying_what_to_do():
    """`_member` is the step that folds a generate function's returned list into one member."""
    same = _member([Sample(index=1, reward=1.0), Sample(index=1, reward=1.0)], "s1")
    assert [(s.status, s.session_id) for s in same] == [(Sample.Status.PENDING, "s1")] * 2
    differing = _member([Sample(index=1, reward=1.0), Sample(index=1, reward=0.0)], "s2")
    assert all(s.status == Sample.Status.FAILED for s in differing)
    error = differing[0].metadata["error"]
    assert "[1.0, 0.0]" in error and "same reward" in error and "--rollout-function-path" in error
