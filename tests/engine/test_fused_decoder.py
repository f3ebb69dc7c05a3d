"""The fused decoder path (dense Llama-family models) against the Hugging Face modules' path."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from slimeish.engine.fused_decoder import FusedDecoder
from slimeish.engine.protocol import SamplingParams, SequenceRequest
from slimeish.engine.scheduler import Scheduler, Sequence
from tests.engine.test_runner import assert_exact, make_scheduler
from tests.peft_adapters import write_peft_adapter

# (prompt, output tokens, step at which it is submitted): later prompts ride in decode steps
WORK = [([5, 6, 7], 12, 0), ([9] * 11, 6, 1), ([3, 1, 4, 1, 5], 9, 1), ([2, 7, 1, 8, 2, 8] * 3, 5, 4)]


def run(sched: Scheduler) -> list[Sequence]:
    finished: list[Sequence] = []
    step = 0
    while step == 0 or not sched.idle:
        for i, (prompt, n, at) in enumerate(WORK):
            if at == step:
                params = SamplingParams(max_new_tokens=n, temperature=0.9, ignore_eos=True)
                req = SequenceRequest(f"r{i}", i, prompt, params, i, True, False, n, logprob_start=0)
                sched.submit(req, lambda s: s.finished and finished.append(s))
        sched.step()
        step += 1
    return sorted(finished, key=lambda s: s.req.rid)


def counted(monkeypatch) -> list[int]:
    """Counts the fused decoder's forwards."""
    calls: list[int] = []
    call = FusedDecoder.__call__
    monkeypatch.setattr(FusedDecoder, "__call__", lambda self, *a: calls.append(1) or call(self, *a))
    return calls


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_fused_and_module_paths_sample_the_same_tokens_with_the_same_logprobs(tiny_model_factory, arch, monkeypatch):
    """Prefill, decode and decode steps with prompts riding along: the same seeds give the same
    tokens, and every log-prob agrees within float32 rounding (the ops are the modules', fused)."""
    path = tiny_model_factory(arch)
    fused, modules = make_scheduler(path), make_scheduler(path)
    assert isinstance(fused.runner.fused, FusedDecoder)
    modules.runner.fused = None
    calls = counted(monkeypatch)
    a, b = run(fused), run(modules)
    assert len(calls) > 10
    assert [s.output_ids for s in a] == [s.output_ids for s in b]
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=2e-6, rtol=0)
        torch.testing.assert_close(torch.tensor(x.input_logprobs), torch.tensor(y.input_logprobs), atol=2e-6, rtol=0)


def test_a_weight_update_reaches_the_fused_weights(tiny_model, tmp_path, monkeypatch):
    """The fused Q/K/V and gate/up tensors are the projections' storage: new weights copied into
    the parameters are what the fused path computes with (checked against a full HF forward)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    new = {}
    for name, p in model.named_parameters():
        if any(k in name for k in ("k_proj", "v_proj", "up_proj")):
            new[name] = p.detach() + 0.05 * torch.randn(p.shape, generator=gen)
    save_file(new, str(tmp_path / "update.safetensors"))
    model.load_state_dict(new, strict=False)
    sched = make_scheduler(tiny_model)
    sched.runner.load_state_dict_file(tmp_path / "update.safetensors")
    calls = counted(monkeypatch)
    finished = run(sched)
    assert calls and len(finished) == len(WORK)
    for seq in finished:
        assert_exact(model, seq)


def test_rows_with_a_lora_adapter_take_the_module_path(tiny_model, tmp_path, monkeypatch):
    """An adapter's delta is added by hooks on the modules, so a forward with an adapter row runs
    them (its log-probs are the merged model's); base-only forwards stay fused with it loaded."""
    adapter = write_peft_adapter(tiny_model, tmp_path / "adapter", seed=1)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, adapter).merge_and_unload().eval()
    sched = make_scheduler(tiny_model)
    lora = sched.runner.lora
    lora.install(lora.read("a", adapter), None)
    calls = counted(monkeypatch)
    finished: list[Sequence] = []
    params = SamplingParams(max_new_tokens=6, temperature=0.9, ignore_eos=True)
    req = SequenceRequest("r", 0, [5, 6, 7], params, 0, True, False, 6, lora_path="a")
    sched.submit(req, lambda s: s.finished and finished.append(s))
    while not sched.idle:
        sched.step()
    assert not calls  # every forward had the adapter's row
    assert_exact(merged, finished[0])
    assert run(sched) and calls  # base-only forwards: fused
