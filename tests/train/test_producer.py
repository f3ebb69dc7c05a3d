"""Samples a rollout function produced without the router become exact buffer turns."""

import pytest

from slimeish.producer import sample_to_turns
from slimeish.types import Sample


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


def test_sample_without_logprobs_is_refused():
    with pytest.raises(ValueError, match="no rollout_log_probs"):
        sample_to_turns("s", Sample(tokens=[1, 2], response_length=1, loss_mask=[1]))
