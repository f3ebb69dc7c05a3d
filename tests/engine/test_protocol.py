"""Unit tests of request validation and sampling (no server)."""

from __future__ import annotations

import random

import pytest
import torch

from slimeish.engine.protocol import ACCEPTED_SAMPLING_KEYS, Limits, RequestError, parse_generate
from slimeish.engine.sampling import RowSampling, sample

LIMITS = Limits(vocab_size=100, context_length=256)


def parse(body):
    return parse_generate(body, lambda text: [ord(c) % 100 for c in text], LIMITS)


def test_single_batch_and_n_expand_in_order():
    seqs, is_batch, stream = parse({"input_ids": [1, 2], "sampling_params": {"n": 3, "sampling_seed": 5}})
    assert is_batch and not stream and [s.index for s in seqs] == [0, 1, 2]
    assert [s.seed for s in seqs] == [5, 6, 7] and len({s.rid for s in seqs}) == 3
    seqs, is_batch, _ = parse({"text": ["ab", "c"], "sampling_params": [{"max_new_tokens": 3}, {"max_new_tokens": 4}]})
    assert is_batch and [s.max_new_tokens for s in seqs] == [3, 4] and seqs[1].input_ids == [99]
    seqs, is_batch, _ = parse({"input_ids": [1], "sampling_params": {"max_new_tokens": None}})
    assert not is_batch and seqs[0].max_new_tokens == 255


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"input_ids": [1], "sampling_params": {"temprature": 1.0}}, "accepted keys"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": "8"}}, "max_new_tokens"),
        ({"input_ids": [1], "sampling_params": {"temperature": -1}}, "temperature"),
        ({"input_ids": [1], "sampling_params": {"ignore_eos": 1}}, "ignore_eos"),
        ({"input_ids": [1], "sampling_params": {"repetition_penalty": 1.2}}, "not supported"),
        ({"input_ids": [1] * 10, "sampling_params": {"max_new_tokens": 250}}, "maximum context length of 256"),
        ({"input_ids": [1, 100]}, "outside the vocabulary"),
        ({"input_ids": [1, -1]}, "outside the vocabulary"),
        ({"input_ids": ["a"]}, "input_ids"),
        ({"input_ids": [1], "text": "a"}, "exactly one"),
        ({"input_ids": [1], "return_logprob": "yes"}, "return_logprob"),
        ({"input_ids": [[1], [2]], "sampling_params": [{}]}, "1 entries for 2 prompts"),
        ({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 3}, r"in \[0, 2\]"),
        ({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": "0"}, "logprob_start_len must be a int"),
    ],
)
def test_bad_requests_name_the_problem(body, needle):
    with pytest.raises(RequestError, match=needle):
        parse(body)


def test_unknown_key_lists_every_accepted_key():
    with pytest.raises(RequestError) as e:
        parse({"input_ids": [1], "sampling_params": {"bogus": 1}})
    assert all(k in str(e.value) for k in ACCEPTED_SAMPLING_KEYS)


def test_sampling_filters_and_reports_temperature_one_logprobs():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    rows = [
        RowSampling(0.0, 1.0, -1),  # greedy
        RowSampling(1.0, 1.0, 1),  # top-k 1 is greedy too
        RowSampling(0.5, 1e-6, -1),  # tiny top-p keeps only the argmax
        RowSampling(2.0, 1.0, 3),
        RowSampling(1.0, 0.5, -1),
        RowSampling(0.7, 1.0, -1),
    ]
    rng = random.Random(0)
    for _ in range(50):
        tokens, logprobs = sample(logits, rows, [rng.random() for _ in rows])
        best = logits.argmax(-1).tolist()
        assert tokens[:3] == best[:3]
        assert tokens[3] in logits[3].topk(3).indices.tolist()
        expected = torch.log_softmax(logits, -1)[torch.arange(6), torch.tensor(tokens)]
        assert torch.allclose(torch.tensor(logprobs), expected)


def test_sampling_depends_only_on_the_uniform():
    logits = torch.randn(3, 40)
    row = RowSampling(1.0, 0.9, 20)
    alone, _ = sample(logits[1:2], [row], [0.3])
    batched, _ = sample(logits, [RowSampling(0.0, 1.0, -1), row, RowSampling(1.0, 1.0, -1)], [0.9, 0.3, 0.1])
    assert alone[0] == batched[1]
