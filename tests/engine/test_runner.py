"""The scheduler and model runner in-process, for each supported model family."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from slimeish.engine.model_runner import ModelRunner
from slimeish.engine.protocol import SamplingParams, SequenceRequest
from slimeish.engine.scheduler import Scheduler, SchedulerConfig, Sequence


def make_scheduler(path, device: str = "cpu", dtype: str = "float32", **overrides) -> Scheduler:
    runner = ModelRunner(str(path), device=device, dtype=dtype, context_length=256)
    cfg = {"max_rows": 4, "max_prefill_tokens": 64, "chunk_size": 64, "total_tokens": 4096, "page_size": 4}
    return Scheduler(runner, SchedulerConfig(**(cfg | overrides)), weight_version=0)


def full_logprobs(model, tokens: list[int]) -> torch.Tensor:
    """log p(tokens[p] | tokens[:p]) for p >= 1 from one forward over everything."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([tokens])).logits[0, :-1], -1)
    return logp[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]


def assert_exact(model, seq: Sequence) -> None:
    prompt = seq.req.input_ids
    expected = full_logprobs(model, prompt + seq.output_ids)
    torch.testing.assert_close(torch.tensor(seq.logprobs), expected[len(prompt) - 1 :], atol=1e-4, rtol=0)
    if seq.req.wants_prompt_logprobs:
        first = max(seq.req.prompt_logprob_start, 1)
        got = torch.tensor(seq.input_logprobs)
        torch.testing.assert_close(got, expected[first - 1 : len(prompt) - 1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "qwen3_moe", "glm4_moe", "deepseek_v3"])
def test_continuous_batch_logprobs_match_hf_for_each_family(tiny_model_factory, arch):
    """Sequences of different lengths join and leave the batch (rows get compacted) and still
    report exactly the logprobs of a full forward over prompt + output."""
    check_continuous_batch(tiny_model_factory(arch), "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_continuous_batch_on_cuda(tiny_model):
    check_continuous_batch(tiny_model, "cuda")


def test_pages_handed_out_in_one_decode_step_are_all_zeroed(tiny_model):
    """The KV pool is uninitialised memory: poisoned with NaN here, every page a sequence takes
    (several sequences cross into new pages in the same decode step, zeroed in one call) must be
    cleared before a forward reads it, or a masked slot's 0 x NaN spoils the log-probs."""
    check_continuous_batch(tiny_model, "cpu", poison=True)


def test_decode_view_too_small_falls_back_to_the_page_gather_and_back(tiny_model):
    """The decode view (each decoding sequence's KV kept as a row across steps) holds the batch
    only while its padded rows fit its byte budget: here the first steps fit, the longer ones
    gather from the pool, and after the long sequence leaves the rows are rebuilt; the log-probs
    match a full forward throughout."""
    check_continuous_batch(tiny_model, "cpu", view_slots=36)


def check_continuous_batch(path, device: str, poison: bool = False, view_slots: int | None = None) -> None:
    sched = make_scheduler(path, device, max_rows=3)
    view = sched.runner.cache.view if sched.runner.cache is not None else None
    assert view is not None
    if view_slots is not None:
        view.max_bytes = view_slots * view.bytes_per_slot
    arranged: list[bool] = []  # per decode step: whether the view held the batch (else pages were gathered)
    arrange = view.arrange

    def counted(*args):
        rows = arrange(*args)
        arranged.append(rows is not None)
        return rows

    setattr(view, "arrange", counted)  # noqa: B010 (mypy refuses assigning to a method)
    if poison:
        cache = sched.runner.cache
        assert cache is not None
        for buf in (*cache.keys, *cache.values):
            buf.fill_(float("nan"))
        sched.runner.clear_pages([sched.pool.num_pages])  # the pad page, zeroed once at allocation
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
    # with the budget cut: the view first, the gather for the longest batches, the view again at
    # the end (one sequence left); otherwise the view throughout
    assert arranged[0] and arranged[-1] and (False in arranged) == (view_slots is not None)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for seq in finished:
        prompt, ids = seq.req.input_ids, seq.output_ids
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(ids)]
        assert (torch.tensor(seq.logprobs) - expected).abs().max().item() <= 1e-4


def test_a_bfloat16_prompt_longer_than_a_chunk_is_served(tiny_model):
    """A chunk after the first attends to the keys before it through a second kernel call whose
    log-sum-exps are float32: the merged output keeps the model's half precision (o_proj takes it)."""
    sched = make_scheduler(tiny_model, dtype="bfloat16", chunk_size=8, max_prefill_tokens=8)
    done = []
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    req = SequenceRequest("long", 0, list(range(3, 30)), params, 0, True, False, 4)
    sched.submit(req, lambda s: s.finished and done.append(s))
    while not sched.idle:
        sched.step()
    assert len(done) == 1 and len(done[0].output_ids) == 4 and all(lp <= 0 for lp in done[0].logprobs)


def make_request(rid: str, n: int) -> SequenceRequest:
    params = SamplingParams(max_new_tokens=n, ignore_eos=True)
    return SequenceRequest(rid, 0, [5, 6, 7], params, None, False, False, n)


async def test_a_failing_step_aborts_its_batch_and_the_loop_goes_on(tiny_model, monkeypatch):
    sched = make_scheduler(tiny_model, dtype="auto", max_rows=2)
    runner = sched.runner
    real_forward = runner.decode_step

    def broken_forward(*args):
        monkeypatch.setattr(runner, "decode_step", real_forward)  # fail once only
        raise RuntimeError("boom")

    monkeypatch.setattr(runner, "decode_step", broken_forward)
    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()
    task = asyncio.create_task(sched.run())
    try:
        sched.submit(make_request("a", 4), lambda s: s.finished and first.set_result(s))
        failed = await asyncio.wait_for(first, 30)
        assert failed.finish_reason["type"] == "abort" and "boom" in failed.finish_reason["message"]
        sched.submit(make_request("b", 4), lambda s: s.finished and second.set_result(s))
        ok = await asyncio.wait_for(second, 30)
        assert ok.finish_reason == {"type": "length", "length": 4} and not sched.running
    finally:
        task.cancel()


def test_scoring_requests_share_a_prefill_with_generating_ones(tiny_model, monkeypatch):
    """Prompts admitted together are prefilled in one forward, right-padded to the longest;
    their log-probs (computed in chunks, here of 2 positions) equal a full forward; scoring-only
    sequences leave the batch at once, and the generating one beside them still decodes exactly."""
    monkeypatch.setattr("slimeish.engine.model_runner._LOGPROB_CHUNK", 2)
    sched = make_scheduler(tiny_model)
    forwards: list[int] = []  # rows per forward of the decoder stack
    layers = sched.runner._layers
    monkeypatch.setattr(
        sched.runner, "_layers", lambda tokens, *a, **k: forwards.append(len(tokens)) or layers(tokens, *a, **k)
    )
    prompts = [[3, 1, 4, 1, 5, 9, 2], [5, 6, 7], [8, 8, 2, 7, 1]]
    new_tokens, starts = [0, 6, 0], [0, None, 2]
    finished = []
    for i, (prompt, n, start) in enumerate(zip(prompts, new_tokens, starts, strict=True)):
        params = SamplingParams(max_new_tokens=n, ignore_eos=True)
        req = SequenceRequest(f"r{i}", i, prompt, params, i, True, False, n, logprob_start=start)
        sched.submit(req, lambda s: s.finished and finished.append(s))
    sched.step()
    assert forwards == [3]
    assert sorted(s.req.rid for s in finished) == ["r0", "r2"] and len(sched.running) == 1
    while not sched.idle:
        sched.step()
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    for seq in finished:
        assert_exact(model, seq)
    assert [len(s.output_ids) for s in sorted(finished, key=lambda s: s.req.rid)] == [0, 6, 0]


def test_a_request_whose_adapter_was_unloaded_before_it_was_queued_is_aborted(tiny_model):
    """The adapter-unload race: /generate checks `lora_path` off the event loop, and an unload may land
    before the request is queued; it is answered as aborted, and no forward meets an unknown adapter."""
    sched = make_scheduler(tiny_model)
    params = SamplingParams(max_new_tokens=3, temperature=0.0)
    gone = SequenceRequest("r0", 0, [5, 6, 7], params, 0, True, False, 3, lora_path="unloaded")
    base = SequenceRequest("r1", 1, [5, 6, 7], params, 0, True, False, 3)
    seqs = [sched.submit(req, lambda s: None) for req in (gone, base)]
    while not sched.idle:
        sched.step()
    assert seqs[0].finish_reason == {"type": "abort", "message": "LoRA adapter 'unloaded' was unloaded"}
    assert seqs[0].output_ids == [] and sched.version_of(seqs[0]) == 0
    assert seqs[1].finish_reason["type"] == "length" and len(seqs[1].output_ids) == 3


def test_whole_prompts_admitted_while_others_decode_ride_in_their_forward(tiny_model, monkeypatch):
    """Prompts admitted while other sequences decode are prefilled in the decode step's own
    forward, packed after the decoding tokens (one forward a step); their prompt log-probs and
    every sequence's output log-probs still equal a full forward's."""
    sched = make_scheduler(tiny_model)
    forwards: list[tuple[int, ...]] = []  # the token ids' shape of each forward of the decoder stack
    stack = sched.runner._stack
    monkeypatch.setattr(sched.runner, "_stack", lambda ids, *a: forwards.append(tuple(ids.shape)) or stack(ids, *a))
    finished = []

    def submit(i: int, prompt: list[int], n: int) -> None:
        params = SamplingParams(max_new_tokens=n, temperature=0.9, ignore_eos=True)
        req = SequenceRequest(f"r{i}", i, prompt, params, i, True, False, n, logprob_start=0)
        sched.submit(req, lambda s: s.finished and finished.append(s))

    submit(0, [5, 6, 7], 8)
    sched.step()
    submit(1, [9] * 11, 6)
    submit(2, [3, 1, 4, 1, 5], 4)
    sched.step()
    assert forwards == [(1, 3), (1, 1 + 11 + 5)]
    while not sched.idle:
        sched.step()
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    assert len(finished) == 3
    for seq in finished:
        assert seq.req.wants_prompt_logprobs
        assert_exact(model, seq)
