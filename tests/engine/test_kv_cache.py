"""The paged KV pool and the prefix cache: bookkeeping alone, then through the scheduler against a
full Hugging Face forward (prefix hits, chunk boundaries, eviction, a pool too small for everyone)."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from slimeish.engine.config import EngineConfig
from slimeish.engine.kv_cache import PagePool
from slimeish.engine.model_runner import DECODE_VIEW_BYTES
from slimeish.engine.protocol import SamplingParams, SequenceRequest
from slimeish.engine.scheduler import Scheduler, Sequence
from slimeish.engine.server import kv_pool_tokens
from tests.engine.test_runner import assert_exact, make_scheduler


def test_pool_shares_cached_pages_and_evicts_least_recently_used_leaves():
    pool = PagePool(num_pages=6, page_size=2)
    a = pool.alloc(3)
    pool.insert([1, 2, 3, 4, 5], a)  # two full pages cached, the third (one token) is not
    pool.release(a)
    assert pool.cached_pages == 2 and pool.evictable == 2 and pool.available == 6
    b = pool.alloc(2)
    pool.insert([1, 2, 7, 8], b)  # shares the first page's tokens: the cached page stays, b[0] is not added
    pool.release(b)
    assert pool.cached_pages == 3 and pool.available == 6
    hit = pool.match([1, 2, 3, 4, 9], limit=4)
    assert hit == a[:2] and pool.evictable == 1  # held by the caller now: not evictable
    fresh = pool.alloc(4)  # three free pages, then evicts the one idle cached page ([7, 8])
    assert pool.match([1, 2, 7, 8], limit=4) == [a[0]]  # the cut is at the path's end
    pool.release([a[0]])
    assert pool.available == 0
    pool.release(hit + fresh)
    pool.flush()
    assert pool.cached_pages == 0 and pool.available == 6


def test_flush_leaves_held_pages_to_their_holders():
    pool = PagePool(num_pages=4, page_size=2)
    pages = pool.alloc(2)
    pool.insert([1, 2, 3, 4], pages)
    pool.flush()
    assert pool.match([1, 2, 3, 4], limit=4) == [] and pool.available == 2
    pool.release(pages)
    assert pool.available == 4


def run(sched: Scheduler, prompts: list[list[int]], new_tokens: int, *, logprob_start: int | None = None) -> list:
    finished: list[Sequence] = []
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_new_tokens=new_tokens, temperature=0.8, ignore_eos=True)
        req = SequenceRequest(f"r{i}", i, prompt, params, i, True, False, new_tokens, logprob_start=logprob_start)
        sched.submit(req, lambda s: s.finished and finished.append(s))
    while not sched.idle:
        sched.step()
        assert sched.reserved >= 0 and sched.pool.available >= sched.reserved
    return sorted(finished, key=lambda s: s.req.index)


@pytest.fixture(scope="module")
def hf_model(tiny_model):
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


@pytest.mark.parametrize("arch", ["qwen2", "deepseek_v3"])
def test_a_prefix_hit_gives_the_logprobs_of_a_miss_and_of_a_full_forward(tiny_model_factory, arch):
    """Turn 2 of an episode resends turn 1 (prompt and output) plus new tokens: with the cache it
    prefills only the rest, in chunks of 5 that cut pages (4 tokens) and the cached boundary.
    DeepSeek-V3's pages hold MLA's latents, and its values are narrower than its keys."""
    tiny_model = tiny_model_factory(arch)
    hf_model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    turn1 = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]
    hit = make_scheduler(tiny_model, chunk_size=5)
    (first,) = run(hit, [turn1], 9)
    assert first.cached_tokens == 0
    turn2 = turn1 + first.output_ids + [11, 12, 13]
    (cached,) = run(hit, [turn2], 12)
    # KV exists for turn 1's prompt and all its output tokens but the last: 22 tokens, 5 full pages
    assert cached.cached_tokens == 20
    (missed,) = run(make_scheduler(tiny_model, chunk_size=5, prefix_cache=False), [turn2], 12)
    assert missed.cached_tokens == 0 and missed.output_ids == cached.output_ids  # same seed, same tokens
    torch.testing.assert_close(torch.tensor(cached.logprobs), torch.tensor(missed.logprobs), atol=1e-5, rtol=0)
    for seq in (first, cached, missed):
        assert_exact(hf_model, seq)


def test_prompt_logprobs_are_computed_not_cached(tiny_model, hf_model):
    """Positions whose log-probs are asked for need their hidden states: the cache stops before them."""
    prompt = list(range(10, 40))
    sched = make_scheduler(tiny_model, chunk_size=7)
    run(sched, [prompt], 4)
    (seq,) = run(sched, [prompt], 4, logprob_start=13)
    assert seq.cached_tokens == 12  # position 13's log-prob needs the hidden state at 12
    assert len(seq.input_logprobs) == len(prompt) - 13
    assert_exact(hf_model, seq)


def test_a_small_pool_evicts_old_prefixes_and_stays_exact(tiny_model, hf_model):
    sched = make_scheduler(tiny_model, total_tokens=64, page_size=4)  # 16 pages
    prompts = [[k] * 3 + list(range(20 + k, 40 + k)) for k in range(4)]  # 23 tokens: 5 full pages + 4 output
    for prompt in prompts:
        run(sched, [prompt], 4)
        assert sched.pool.available == 16  # nothing leaks: every page is free or idle in the cache
    assert sched.pool.cached_pages <= 16
    newest, oldest = run(sched, [prompts[3], prompts[0]], 4)
    assert newest.cached_tokens == 20 and oldest.cached_tokens == 0
    for seq in (newest, oldest):
        assert_exact(hf_model, seq)


def test_requests_wait_for_pages_instead_of_failing(tiny_model, hf_model):
    """Three requests that each need 6 of the pool's 8 pages: one runs at a time, all finish exactly."""
    sched = make_scheduler(tiny_model, total_tokens=32, page_size=4, prefix_cache=False)
    prompts = [[k, 5, 6, 7, 8, 9, 10, 11, 12] for k in (1, 2, 3)]
    finished: list[Sequence] = []
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_new_tokens=14, temperature=0.8, ignore_eos=True)
        req = SequenceRequest(f"r{i}", i, prompt, params, i, True, False, 14)
        sched.submit(req, lambda s: s.finished and finished.append(s))
    most_running = 0
    while not sched.idle:
        sched.step()
        most_running = max(most_running, len(sched.running))
    assert most_running == 1 and len(finished) == 3
    for seq in finished:
        assert len(seq.output_ids) == 14 and seq.finish_reason == {"type": "length", "length": 14}
        assert_exact(hf_model, seq)


def test_a_prompt_is_shared_as_soon_as_it_is_prefilled(tiny_model, hf_model):
    """A twin of a prompt that is still decoding (a retry, the next member of a group) reuses its pages."""
    sched = make_scheduler(tiny_model)
    prompt = list(range(50, 73))  # 23 tokens: 5 full pages of 4
    finished: list[Sequence] = []
    for i in range(2):
        params = SamplingParams(max_new_tokens=10, temperature=0.8, ignore_eos=True)
        req = SequenceRequest(f"r{i}", i, prompt, params, i, True, False, 10)
        sched.submit(req, lambda s: s.finished and finished.append(s))
        sched.step()
    while not sched.idle:
        sched.step()
    first, twin = sorted(finished, key=lambda s: s.req.index)
    assert (first.cached_tokens, twin.cached_tokens) == (0, 20)
    for seq in (first, twin):
        assert_exact(hf_model, seq)


def test_the_memory_fraction_holds_the_pool_and_the_decode_view():
    """Without --max-total-tokens the pool is the share of RAM less the decode view's cap: the two
    together stay within --mem-fraction-static."""
    bytes_per_token = 4096
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cfg = EngineConfig(model="unused", device="cpu", mem_fraction_static=0.05)
    tokens = kv_pool_tokens(cfg, bytes_per_token)
    assert tokens % cfg.page_size == 0 and tokens >= cfg.page_size
    assert tokens * bytes_per_token + DECODE_VIEW_BYTES <= ram * cfg.mem_fraction_static
    assert (tokens + cfg.page_size) * bytes_per_token + DECODE_VIEW_BYTES > ram * cfg.mem_fraction_static
    assert kv_pool_tokens(EngineConfig(model="unused", max_total_tokens=1000), bytes_per_token) == 992  # whole pages
    with pytest.raises(ValueError, match=r"got 0 tokens: raise --max-total-tokens, or --mem-fraction-static"):
        kv_pool_tokens(EngineConfig(model="unused", mem_fraction_static=DECODE_VIEW_BYTES / ram / 2), bytes_per_token)
