"""The producer: uncaptured samples become exact buffer turns; stale members are regenerated
into their own group (against a real valkey-server)."""

from types import SimpleNamespace

import pytest

from slimeish.buffer import Buffer, BufferConfig
from slimeish.common.sample import Sample
from slimeish.data import DataSource
from slimeish.rollout import RolloutFnTrainOutput
from slimeish.rollout_functions.sessions import rollout_output
from slimeish.train.producer import RolloutProducer, sample_to_turns


def test_each_run_of_sampled_tokens_is_one_turn():
    # prompt [1, 2] | sampled [3, 4] | given (tool result) [5] | sampled [6]
    sample = Sample(
        tokens=[1, 2, 3, 4, 5, 6],
        response_length=4,
        loss_mask=[1, 1, 0, 1],
        rollout_log_probs=[-0.1, -0.2, 0.0, -0.3],
        weight_versions=[7],
    )
    turns = sample_to_turns("s", sample)
    assert [(t.turn_index, t.prompt_ids, t.output_ids, t.output_logprobs) for t in turns] == [
        (0, [1, 2], [3, 4], [-0.1, -0.2]),
        (1, [5], [6], [-0.3]),
    ]
    assert all(t.weight_versions == [7] and t.segment_index == 0 for t in turns)
    # The buffer rebuilds the segment as the concatenation of prompt_ids + output_ids.
    assert [tok for t in turns for tok in t.prompt_ids + t.output_ids] == sample.tokens


def test_a_later_sample_of_a_session_starts_its_own_segment():
    sample = Sample(tokens=[1, 2, 3], response_length=1, loss_mask=[1], rollout_log_probs=[-0.5], weight_versions=["3"])
    (turn,) = sample_to_turns("s", sample, first_turn=2, segment=1)
    assert (turn.turn_index, turn.segment_index, turn.split_reason) == (2, 1, "returned_sample")
    assert turn.weight_versions == [3]  # SGLang's string versions are read as ints


def test_sample_without_logprobs_is_refused():
    with pytest.raises(ValueError, match="no rollout_log_probs") as exc:
        sample_to_turns("s", Sample(tokens=[1, 2], response_length=1, loss_mask=[1]))
    assert "--loss-type sft_loss" in str(exc.value)


def test_an_sft_sample_without_logprobs_is_recorded_with_placeholders():
    sample = Sample(tokens=[1, 2, 3, 4, 5], response_length=3, loss_mask=[1, 0, 1])
    turns = sample_to_turns("s", sample, loss_type="sft_loss")
    assert [(t.prompt_ids, t.output_ids, t.output_logprobs) for t in turns] == [([1, 2], [3], [0.0]), ([4], [5], [0.0])]


class VersionedRollout:
    """A slime-style rollout function (no router): member i's token comes from weight version
    `versions[i]`, its reward is i; every call is recorded as (group_index, indices)."""

    def __init__(self, versions: dict[int, int]):
        self.versions = versions
        self.calls: list[tuple[int, list[int]]] = []

    def __call__(self, args, rollout_id, data_source, evaluation=False):
        groups = data_source.get_samples(args.rollout_batch_size)
        for group in groups:
            self.calls.append((group[0].group_index, [s.index for s in group]))
            for s in group:
                s.tokens, s.response_length, s.loss_mask = [1, 2, 3], 1, [1]
                s.rollout_log_probs, s.weight_versions = [-0.5], [self.versions[s.index]]
                s.reward, s.status = float(s.index), Sample.Status.COMPLETED
        return RolloutFnTrainOutput(samples=groups)


async def test_stale_members_are_generated_again_into_their_group(valkey):
    args = SimpleNamespace(rollout_batch_size=1, n_samples_per_prompt=3)
    data = DataSource([Sample(prompt="p", label="L", metadata={"k": 1})], 3, shuffle=False)
    rollout = VersionedRollout({0: 1, 1: 4, 2: 1})  # member 1 ran long, so its token is the fresh one
    async with Buffer(valkey.url, "producer-regen", BufferConfig(max_staleness=2)) as buffer:
        producer = RolloutProducer(rollout, args, data, buffer)
        await producer.run_once()
        assert (await buffer.take_groups(1, "t", current_version=5)).groups == []  # reopened: 0 and 2 are stale
        rollout.versions = {0: 5, 1: None, 2: 5}
        await producer.run_once()
        (group,) = (await buffer.take_groups(1, "t", current_version=5)).groups
    assert rollout.calls == [(0, [0, 1, 2]), (0, [0, 2])]  # the second call served only the stale members
    assert group.group_id == "g0"
    assert [(s.index, s.reward, s.weight_versions) for s in group.samples] == [
        (0, 0.0, [5]),
        (1, 1.0, [4]),
        (2, 2.0, [5]),
    ]
    assert group.metadata == {"prompt": "p", "label": "L", "group_index": 0, "eval": False, "k": 1}


class ReportingRollout(VersionedRollout):
    """VersionedRollout with the metrics every built-in rollout function reports."""

    def __call__(self, args, rollout_id, data_source, evaluation=False):
        return rollout_output(super().__call__(args, rollout_id, data_source).samples, evaluation)


async def test_a_step_reports_every_rollout_call_since_the_last_one(valkey):
    # async mode runs a call per group: a step's episodes/ covers all of them, not the last one
    args = SimpleNamespace(rollout_batch_size=1, n_samples_per_prompt=2)
    data = DataSource([Sample(prompt="p", label="L"), Sample(prompt="q", label="M")], 2, shuffle=False)
    async with Buffer(valkey.url, "producer-metrics", BufferConfig()) as buffer:
        producer = RolloutProducer(ReportingRollout({0: 0, 1: 0}), args, data, buffer)
        await producer.run_once()
        await producer.run_once()
        step = producer.take_metrics()
        assert producer.take_metrics() == {}  # taken once
    assert step["episodes/episodes"] == 4 and step["episodes/rewarded"] == 4
    assert step["episodes/reward_mean"] == 0.5 and step["episodes/reward_std"] == 0.5  # rewards 0, 1, 0, 1


class TeacherScoredRollout:
    """A slime-style rollout whose reward post-process left each sample's `teacher_log_probs`
    (a tensor, as slime's OPD post-process sets them), one per response token."""

    def __call__(self, args, rollout_id, data_source, evaluation=False):
        import torch

        groups = data_source.get_samples(args.rollout_batch_size)
        for group in groups:
            for s in group:
                s.tokens, s.response_length, s.loss_mask = [1, 2, 3, 4], 3, [1, 0, 1]
                s.rollout_log_probs, s.weight_versions = [-0.5, 0.0, -0.25], [0]
                s.teacher_log_probs = torch.tensor([-1.0, -2.0, -0.5 - s.index])
                s.reward, s.status = 0.0, Sample.Status.COMPLETED
        return RolloutFnTrainOutput(samples=groups)


async def test_teacher_log_probs_come_back_aligned_with_the_rollout_log_probs(valkey):
    args = SimpleNamespace(rollout_batch_size=1, n_samples_per_prompt=2)
    data = DataSource([Sample(prompt="p", label="L")], 2, shuffle=False)
    async with Buffer(valkey.url, "producer-teacher", BufferConfig()) as buffer:
        await RolloutProducer(TeacherScoredRollout(), args, data, buffer).run_once()
        (group,) = (await buffer.take_groups(1, "t", current_version=0)).groups
    for s in group.samples:
        assert s.rollout_log_probs == [-0.5, 0.0, -0.25]
        assert s.teacher_log_probs == [-1.0, -2.0, -0.5 - s.index]
        assert "teacher_log_probs" not in s.metadata  # moved to the field, not left beside it
