"""Building samples from turns (pure): the Sample conventions and refusal of inconsistent turns."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest
import torch

from slimeish.buffer import BufferInputError, Turn
from slimeish.buffer.codec import decode_sample_header, decode_turn, encode_sample_header, encode_turn
from slimeish.buffer.segments import assemble, build_samples, check_next_turn
from slimeish.common.routed_experts import decode_routed_experts, encode_routed_experts, new_token_rows
from slimeish.common.sample import Sample
from tests.buffer.buffer_helpers import turn


def samples(turns: list[Turn], status: str = "completed", **kw) -> list[Sample]:
    packed = [t.pack() for t in turns]
    built = build_samples(
        packed,
        status=status,
        index=kw.get("index", 0),
        group_index=kw.get("group_index", 0),
        metadata=kw.get("metadata", {}),
    )
    return [b.to_sample(None) for b in built]


def test_multi_turn_segment_masks_only_sampled_tokens():
    turns = [
        Turn("s", 0, 0, None, [10, 11, 12], [20, 21], [-0.1, -0.2], [3]),
        Turn("s", 1, 0, None, [30, 31], [40], [-0.4], [3, 4]),  # tool result, then more output
    ]
    (sample,) = samples(turns, index=2, group_index=7, metadata={"k": 1})
    assert sample.tokens == [10, 11, 12, 20, 21, 30, 31, 40]
    assert sample.response_length == 5 and sample.prompt_length == 3
    assert sample.loss_mask == [1, 1, 0, 0, 1]
    assert sample.rollout_log_probs == pytest.approx([-0.1, -0.2, 0.0, 0.0, -0.4])  # stored as float32
    assert sample.weight_versions == [3, 4]
    assert (sample.index, sample.group_index, sample.session_id, sample.segment_index) == (2, 7, "s", 0)


def test_each_segment_becomes_one_sample_with_its_split_reason():
    turns = [turn("s", 0), turn("s", 1, prompt=[9]), turn("s", 2, seg=1, prompt=[7, 7], split_reason="history_edited")]
    first, second = samples(turns)
    assert first.tokens == [1, 2, 3, 4, 5, 9, 4, 5] and first.split_reason is None
    assert second.tokens == [7, 7, 4, 5] and second.segment_index == 1 and second.split_reason == "history_edited"
    assert second.loss_mask == [1, 1]


def test_failed_session_has_no_samples():
    assert samples([turn("s", 0)], status="failed") == []


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (Turn("s", 0, 0, None, [1], [2, 3], [-0.1], [0]), "output_logprobs"),
        (Turn("s", 0, 0, None, [1], [2], [float("nan")], [0]), "finite"),
        (Turn("s", 0, 0, None, [1], [2, 3], [-0.1, float("nan")], [0]), "finite"),
        (Turn("s", 0, 0, None, [1], [2], [float("-inf")], [0]), "finite"),
        (Turn("s", 0, 0, None, [1], [2], [float("inf")], [0]), "finite"),
        (Turn("s", 0, 0, None, [1], [2], [0.1], [0]), "<= 0"),
        (Turn("s", 0, 0, None, [1], [2], [-0.1], []), "weight_versions"),
        (Turn("s", 0, 0, None, [1], [-2], [-0.1], [0]), "token ids in"),
        (Turn("s", 0, 0, None, [1], [2**31], [-0.1], [0]), "token ids in"),
        (Turn("s", 0, 0, None, [5, -(2**63)], [2], [-0.1], [0]), "prompt_ids must be token ids"),
        (Turn("s", 0, 0, None, [1], [[2]], [-0.1], [0]), "flat list"),
        (Turn("s", 0, 0, None, [1], [2], [-0.1], [0], parse_failure=""), "parse_failure"),
        (Turn("s", 0, 0, None, [1], [2], [-0.1], [0], tool_calls=-1), "tool_calls"),
    ],
)
def test_inconsistent_turns_are_refused(bad, message):
    with pytest.raises(BufferInputError, match=message):
        bad.validate()


def test_turn_order_and_segments_are_checked():
    first = turn("s", 0).pack()
    check_next_turn(None, first, 0)
    check_next_turn(first, turn("s", 1, seg=1, prompt=[5]).pack(), 1)
    with pytest.raises(BufferInputError, match="segment_index 2"):
        check_next_turn(first, turn("s", 1, seg=2).pack(), 1)
    with pytest.raises(BufferInputError, match="no prompt_ids"):
        check_next_turn(first, turn("s", 1, seg=1, prompt=[]).pack(), 1)
    with pytest.raises(BufferInputError, match="never appended"):
        check_next_turn(None, turn("s", 3).pack(), 0)
    # lineages interleave: a turn continues any earlier segment, without a prompt of its own
    check_next_turn(turn("s", 2, seg=1).pack(), turn("s", 3, seg=0, prompt=[]).pack(), 2)


def test_interleaved_lineages_are_one_sample_each_with_their_lineage():
    main0, sub0 = turn("s", 0), replace(turn("s", 1, seg=1, prompt=[7], split_reason="new_conversation"), lineage=1)
    main1, sub1 = turn("s", 2, prompt=[8]), replace(turn("s", 3, seg=1, prompt=[9]), lineage=1)
    main, sub = samples([main0, sub0, main1, sub1], metadata={"prompt": "p"})
    assert main.tokens == [*main0.prompt_ids, *main0.output_ids, *main1.prompt_ids, *main1.output_ids]
    assert sub.tokens == [*sub0.prompt_ids, *sub0.output_ids, *sub1.prompt_ids, *sub1.output_ids]
    assert (main.metadata, sub.metadata) == ({"prompt": "p", "lineage": 0}, {"prompt": "p", "lineage": 1})
    assert (main.split_reason, sub.split_reason) == (None, "new_conversation")


def test_codec_round_trips_and_is_compact():
    t = turn("s", 0, prompt=list(range(1000)), out=list(range(500)))
    assert decode_turn(encode_turn(t.pack())).to_turn() == t  # -0.5 is exact in float32
    stored = encode_turn(t.pack())
    assert len(stored) < 1500 * 4 + 500 * 4 + 300  # int32 ids, float32 log-probs, a small header
    (packed,) = build_samples([t.pack()], status="completed", index=0, group_index=0, metadata={"group_id": "g"})
    header = encode_sample_header(packed)
    assert len(header) < 200  # the arrays are stored once, in the turns
    assert assemble([decode_turn(stored)], [decode_sample_header(header)], 0.5) == [packed.to_sample(0.5)]


def test_a_segment_carries_its_tool_parse_outcome_in_metadata():
    parsed = replace(turn("s", 0), tool_calls=2)
    failed = replace(turn("s", 1, prompt=[9]), parse_failure="malformed")
    split = replace(turn("s", 2, seg=1, prompt=[7], split_reason="r"), parse_failure="truncated")
    first, second = samples([parsed, failed, split], metadata={"prompt": "p"})
    assert first.metadata == {"prompt": "p", "tool_parse": {"calls": 2, "failures": {"malformed": 1}}}
    assert second.metadata["tool_parse"] == {"calls": 0, "failures": {"truncated": 1}}
    (plain,) = samples([turn("s", 0)], metadata={"prompt": "p"})
    assert plain.metadata == {"prompt": "p"}  # no call and no failure: nothing added


def test_a_turn_stored_before_the_parse_outcome_decodes_as_parsed():
    t = replace(turn("s", 0), parse_failure="truncated", tool_calls=1)
    assert decode_turn(encode_turn(t.pack())).to_turn() == t
    old = msgspec.msgpack.decode(encode_turn(turn("s", 0).pack()))
    del old["parse_failure"], old["tool_calls"]
    stored = decode_turn(msgspec.msgpack.encode(old))
    assert (stored.parse_failure, stored.tool_calls) == (None, 0)


def test_teacher_log_probs_given_at_finish_are_stored_per_segment_as_float32():
    """OPD: the finish metadata's teacher log-probs (one list per segment) go onto each segment's
    sample, as float32 bytes in its header, not into its metadata."""
    turns = [turn("s", 0, prompt=[1, 2], out=[3, 4]), turn("s", 1, seg=1, prompt=[5], out=[6])]
    teacher = {"teacher_log_probs": [[-0.5, -1.25], [-2.0]], "k": 1}
    packed = build_samples([t.pack() for t in turns], status="completed", index=0, group_index=0, metadata=teacher)
    headers = [decode_sample_header(encode_sample_header(p)) for p in packed]
    assert all(len(h["teacher_log_probs"]) == 4 * p.response_length for h, p in zip(headers, packed, strict=True))
    rebuilt = assemble([decode_turn(encode_turn(t.pack())) for t in turns], headers, 0.0)
    assert [s.teacher_log_probs for s in rebuilt] == [[-0.5, -1.25], [-2.0]]
    assert all(s.metadata == {"k": 1} for s in rebuilt)
    assert [s.teacher_log_probs for s in samples(turns)] == [None, None]  # none given: none stored


def test_routed_experts_of_a_segments_turns_join_into_the_samples_rows_through_the_codec():
    """Each turn stores the rows of its new tokens (int16); the sample gets every token's but the
    last, as the engine's base64 int32 `routed_experts` would give them for the whole sequence."""
    tokens = [10, 11, 12, 20, 21, 30, 31, 40]  # turn 0: prompt 3 + output 2; turn 1: tail 2 + output 1
    full = torch.arange(7 * 4).reshape(7, 2, 2) % 8  # the engine's rows for tokens[:-1]: 2 layers x top-2
    first = new_token_rows(encode_routed_experts(full[:4]), 4, 5)  # turn 0 forwarded 3 + 2 - 1 tokens
    second = new_token_rows(encode_routed_experts(full), 7, 3)  # turn 1 forwarded its 7-token input
    turns = [
        Turn("s", 0, 0, None, [10, 11, 12], [20, 21], [-0.1, -0.2], [3], routed_experts=first),
        Turn("s", 1, 0, None, [30, 31], [40], [-0.4], [3], routed_experts=second),
    ]
    stored = [decode_turn(encode_turn(t.pack())) for t in turns]
    (built,) = build_samples(stored, status="completed", index=0, group_index=0, metadata={})
    sample = built.to_sample(None)
    assert sample.tokens == tokens
    assert torch.equal(decode_routed_experts(sample.rollout_routed_experts, len(tokens) - 1), full.reshape(7, 4))
    without = [turns[0], replace(turns[1], routed_experts=None)]
    assert samples(without)[0].rollout_routed_experts is None  # one turn without rows: no routes at all
    assert new_token_rows(encode_routed_experts(full.flatten()[:10]), 4, 5) is None  # ids that fit no 4 rows
