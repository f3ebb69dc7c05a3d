"""The scheduler and model runner in-process, for each supported model family."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from slimeish.engine.model_runner import ModelRunner
from slimeish.engine.protocol import SamplingParams, SequenceRequest
from slimeish.engine.scheduler import Scheduler


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_continuous_batch_logprobs_match_hf_for_each_family(tiny_model_factory, arch):
    """Sequences of different lengths join and leave the batch (rows get compacted) and still
    report exactly the logprobs of a full forward over prompt + output."""
    check_continuous_batch(tiny_model_factory(arch), "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_continuous_batch_on_cuda(tiny_model):
    check_continuous_batch(tiny_model, "cuda")


def check_continuous_batch(path, device: str) -> None:
    runner = ModelRunner(str(path), device=device, dtype="float32", rows=4, context_length=256)
    sched = Scheduler(runner, max_rows=3, max_prefill_tokens=64, weight_version="0")
    finished = []
    prompts = [[5, 6, 7], [9] * 11, [3, 1, 4, 1, 5], [2, 7], [8, 8, 8, 8]]
    lengths = [30, 5, 17, 9, 12]
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        params = SamplingParams(max_new_tokens=n, temperature=0.9, ignore_eos=True)
        req = SequenceRequest(f"r{i}", i, prompt, params, seed=i, return_logprob=True, return_text_in_logprobs=False)
        req.max_new_tokens = n
        sched.submit(req, lambda s: s.finished and finished.append(s))
    while not sched.idle:
        sched.step()
        assert len(sched.running) <= 3
    assert sorted(len(s.output_ids) for s in finished) == sorted(lengths)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for seq in finished:
        prompt, ids = seq.req.input_ids, seq.output_ids
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(ids)]
        assert (torch.tensor(seq.logprobs) - expected).abs().max().item() <= 1e-4
