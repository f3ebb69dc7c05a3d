"""The scheduler: which sequences run each step, iteration-level (continuous) batching.

Every step (1) admits waiting sequences while the KV pool can promise them the pages they may
need (a request that does not fit waits in the queue; the engine never runs out of KV memory
mid-request), (2) prefills admitted prompts in chunks, up to `max_prefill_tokens` per step,
(3) decodes one token for every sequence whose prompt is done, all in one batched forward, and
(4) retires the finished ones: their full pages go to the prefix cache, the rest back to the pool.
A short request therefore never waits for an unrelated long one; a long prompt is prefilled a few
chunks per step while the others keep decoding. Forwards are few: prompts whose prefill starts in
the same step share one, and a whole prompt admitted while others decode rides in the decode
forward (`ModelRunner.decode_step`); then every sequence's next token is sampled in one call.

The loop runs as a task on the server's event loop: a step is synchronous (a few ms on CPU), and
the loop yields between steps so HTTP handlers, pauses and weight updates run only between steps,
never during a forward. Pausing stops stepping without touching any sequence (SGLang's in-place
pause), so paused requests resume where they were.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from slimeish.engine.kv_cache import PagePool
from slimeish.engine.model_runner import ModelRunner, PrefillChunk
from slimeish.engine.protocol import SequenceRequest
from slimeish.engine.sampling import RowSampling, sample

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Sequence:
    """A sequence being generated, with everything its response needs."""

    req: SequenceRequest
    notify: Callable[[Sequence], None]  # called after each new token and at the end
    rng: random.Random
    sampling: RowSampling
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    input_logprobs: list[float] = field(default_factory=list)  # input positions >= max(logprob_start, 1)
    weight_spans: list[list[int]] = field(default_factory=list)  # [version, start, end) over output tokens
    finish_reason: dict | None = None
    text: str = ""
    started_at: float = field(default_factory=time.monotonic)
    decoded: tuple[int, str] = (0, "")  # (len(output_ids) it covers, decoded text): one decode per step
    pages: list[int] = field(default_factory=list)  # its page table: position p lives in pages[p // page_size]
    reserved: int = 0  # pages promised at admission and not taken yet
    kv_len: int = 0  # positions whose KV is written (or came from the prefix cache)
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    epoch: int = 0  # the prefix cache's epoch when admitted: KV from an older one is never shared
    routed_experts: torch.Tensor | None = None  # at the end, if asked: [kv_len, moe_layers, top_k]
    uid: int = field(default_factory=itertools.count().__next__)  # never reused: names its decode-view row

    @property
    def prefilling(self) -> bool:
        return self.kv_len < len(self.req.input_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(kw_only=True, slots=True)
class SchedulerConfig:
    max_rows: int  # sequences running at once
    max_prefill_tokens: int  # prompt tokens prefilled per step
    chunk_size: int  # prompt tokens per prefill forward
    total_tokens: int  # KV pool size in token slots
    page_size: int
    prefix_cache: bool = True


class Scheduler:
    def __init__(self, runner: ModelRunner, cfg: SchedulerConfig, *, weight_version: int):
        self.runner = runner
        self.cfg = cfg
        self.pool = PagePool(cfg.total_tokens // cfg.page_size, cfg.page_size)
        runner.allocate_kv(self.pool.num_pages, cfg.page_size)
        self.weight_version = weight_version
        self.eos_ids = _eos_ids(runner)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.reserved = 0  # sum of the running sequences' `reserved`
        self.epoch = 0
        self.paused = False
        self._wake = asyncio.Event()

    # ---- requests in and out -------------------------------------------------------------
    def submit(self, req: SequenceRequest, notify: Callable[[Sequence], None]) -> Sequence:
        seed = req.seed if req.seed is not None else random.getrandbits(63)
        p = req.params
        seq = Sequence(req, notify, random.Random(seed), RowSampling(p.temperature, p.top_p, p.top_k))
        if req.lora_path is not None and req.lora_path not in self.runner.lora.adapters:
            # unloaded after the request was parsed (off the event loop) and before it got here:
            # answered as aborted, as a forward must never meet an adapter name it cannot find
            self._finish(seq, {"type": "abort", "message": f"LoRA adapter {req.lora_path!r} was unloaded"})
        elif req.max_new_tokens == 0 and not req.wants_prompt_logprobs:
            self._finish(seq, {"type": "length", "length": 0})
        else:
            self.waiting.append(seq)
            self._wake.set()
        return seq

    def abort(self, rid: str | None = None, message: str = "aborted by /abort_request") -> int:
        """Abort the sequences of request `rid` (all when None); returns how many."""
        hit = [s for s in (*self.waiting, *self.running) if rid is None or s.req.rid == rid or _parent(s) == rid]
        self.abort_sequences(hit, message)
        return len(hit)

    def abort_sequences(self, seqs: list[Sequence], message: str) -> None:
        for seq in seqs:
            self._finish(seq, {"type": "abort", "message": message})
        self.waiting = deque(s for s in self.waiting if not s.finished)
        self._retire()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._wake.set()

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    # ---- the loop -------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            if self.paused or self.idle:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                self.step()
            except Exception as e:  # answer the batch with the error instead of hanging every client
                logger.exception("engine step failed; aborting running and waiting requests")
                self.abort(None, f"engine error: {type(e).__name__}: {e}")
            await asyncio.sleep(0)  # let HTTP handlers run between steps

    def flush_cache(self) -> None:
        """Empty the prefix cache. Running sequences keep the KV they hold, but it is never shared
        afterwards: after a weight update it was (partly) computed by the old weights."""
        self.pool.flush()
        self.epoch += 1

    def step(self) -> None:
        decoding = [s for s in self.running if not s.prefilling]
        self._admit()
        planned = self._plan_prefill()
        # whole prompts ride in the decode step's forward (when the runner can mix them in)
        rides = [bool(decoding) and c.start == 0 and c.end == len(c.prompt) for _, c in planned]
        alone = [sc for sc, ride in zip(planned, rides, strict=True) if not ride]
        riding = [sc for sc, ride in zip(planned, rides, strict=True) if ride]
        prefilled = self._prefilled(alone, self.runner.prefill([c for _, c in alone], self.cfg.chunk_size))
        # every sequence's next token in one sampling call; the decode batch's logits stay one block
        # (split into rows and stacked again, they cost ~0.1 ms a step at c=64)
        seqs: list[Sequence] = []
        blocks: list[torch.Tensor] = []
        if decoding:
            logits, results = self._decode(decoding, [c for _, c in riding])
            seqs, blocks = list(decoding), [logits]
            prefilled += self._prefilled(riding, results)
        if prefilled:
            seqs += [s for s, _ in prefilled]
            blocks.append(torch.stack([lg for _, lg in prefilled]))
        if seqs:
            self._append(seqs, blocks[0] if len(blocks) == 1 else torch.cat(blocks))
        self._retire()

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.cfg.max_rows:
            seq = self.waiting[0]
            prompt = seq.req.input_ids
            cached = self.pool.match(prompt, self._cacheable(seq)) if self._shares_cache(seq) else []
            # KV is written for the prompt and every output token but the last (never fed back)
            need = self.pool.pages_for(len(prompt) + max(seq.req.max_new_tokens - 1, 0)) - len(cached)
            if need > self.pool.available - self.reserved:
                self.pool.release(cached)
                return  # it waits (first come, first served) until finished sequences give pages back
            self.waiting.popleft()
            seq.pages, seq.reserved, seq.epoch = cached, need, self.epoch
            seq.kv_len = seq.cached_tokens = len(cached) * self.cfg.page_size
            self.reserved += need
            self.running.append(seq)

    def _shares_cache(self, seq: Sequence) -> bool:
        """The prefix cache holds the base model's KV: a LoRA sequence's KV differs, so it neither
        reads nor writes the cache."""
        return self.cfg.prefix_cache and seq.req.lora_path is None

    def uses_adapter(self, name: str) -> int:
        """How many waiting or running sequences generate with LoRA adapter `name`."""
        return sum(s.req.lora_path == name for s in (*self.waiting, *self.running))

    def _cacheable(self, seq: Sequence) -> int:
        """How many prompt tokens may come from the cache: at least the last one is computed (its
        logits give the first output token), and every position whose log-prob is asked for."""
        return min(len(seq.req.input_ids), max(seq.req.prompt_logprob_start, 1)) - 1

    def _plan_prefill(self) -> list[tuple[Sequence, PrefillChunk]]:
        """This step's prompt chunks, up to `max_prefill_tokens`, their pages taken and zeroed."""
        budget = self.cfg.max_prefill_tokens
        planned: list[tuple[Sequence, PrefillChunk]] = []
        fresh_pages: list[int] = []
        for seq in self.running:
            prompt, end = seq.req.input_ids, seq.kv_len
            while end < len(prompt) and budget > 0:
                start = end
                end = min(len(prompt), start + self.cfg.chunk_size, start + budget)
                fresh_pages += self._take_pages(seq, end)
                chunk = PrefillChunk(prompt, start, end, seq.pages, seq.req.prompt_logprob_start, seq.req.lora_path)
                planned.append((seq, chunk))
                budget -= end - start
        self.runner.clear_pages(fresh_pages)
        return planned

    def _prefilled(
        self, planned: list[tuple[Sequence, PrefillChunk]], results: list[tuple[torch.Tensor, list[float]]]
    ) -> list[tuple[Sequence, torch.Tensor]]:
        """Record prefilled chunks; returns the sequences whose prompt is done and that generate,
        with the logits of their first token."""
        done: list[tuple[Sequence, torch.Tensor]] = []
        for (seq, chunk), (logits, logprobs) in zip(planned, results, strict=True):
            seq.input_logprobs += logprobs
            seq.kv_len = chunk.end
            if not seq.prefilling:
                done.append((seq, logits))
        for seq, _ in done:
            self._cache(seq)  # a twin prompt arriving while this one decodes (n > 1, retries) reuses it
            if seq.req.max_new_tokens == 0:  # a scoring request: the prompt's log-probs only
                self._finish(seq, {"type": "length", "length": 0})
        return [(s, lg) for s, lg in done if not s.finished]

    def _decode(
        self, batch: list[Sequence], prompts: list[PrefillChunk]
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, list[float]]]]:
        """One token for each of `batch`, with whole `prompts` riding along (`ModelRunner.decode_step`)."""
        # the pages the batch crosses into, zeroed in one call
        self.runner.clear_pages([page for seq in batch for page in self._take_pages(seq, seq.kv_len + 1)])
        positions = [s.kv_len for s in batch]
        tokens, pages = [s.output_ids[-1] for s in batch], [s.pages for s in batch]
        adapters, uids = [s.req.lora_path for s in batch], [s.uid for s in batch]
        out = self.runner.decode_step(tokens, positions, pages, adapters, uids, prompts, self.cfg.chunk_size)
        for seq in batch:
            seq.kv_len += 1
        return out

    def _take_pages(self, seq: Sequence, kv_len: int) -> list[int]:
        """Give `seq` the pages for positions below `kv_len`, out of what admission promised it;
        returns the new ones, which the caller zeroes (`ModelRunner.clear_pages`) before a forward."""
        n = self.pool.pages_for(kv_len) - len(seq.pages)
        if n <= 0:
            return []
        assert n <= seq.reserved, "a sequence outgrew what admission reserved for it"
        fresh = self.pool.alloc(n)
        seq.pages += fresh
        seq.reserved -= n
        self.reserved -= n
        return fresh

    def _append(self, seqs: list[Sequence], logits) -> None:
        tokens, logprobs = sample(logits, [s.sampling for s in seqs], [s.rng.random() for s in seqs])
        for seq, token, logprob in zip(seqs, tokens, logprobs, strict=True):
            seq.output_ids.append(token)
            seq.logprobs.append(logprob)
            self._note_version(seq)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self._finish(seq, reason)
            else:
                seq.notify(seq)

    def version_of(self, seq: Sequence) -> int:
        """The weight version `seq` samples under: its LoRA adapter's own, or the base model's (also
        for a request refused before its first token because its adapter was unloaded)."""
        return self.runner.lora.versions.get(seq.req.lora_path or "", self.weight_version)

    def _note_version(self, seq: Sequence) -> None:
        n, version = len(seq.output_ids), self.version_of(seq)
        if seq.weight_spans and seq.weight_spans[-1][0] == version:
            seq.weight_spans[-1][2] = n
        else:
            seq.weight_spans.append([version, n - 1, n])

    def _stop_reason(self, seq: Sequence, token: int) -> dict | None:
        p = seq.req.params
        if token in (p.stop_token_ids or ()) or (not p.ignore_eos and token in self.eos_ids):
            return {"type": "stop", "matched": token}
        if p.stop_strings:
            text = self.decode(seq)
            for stop in p.stop_strings:
                if stop in text:
                    return {"type": "stop", "matched": stop}
        if len(seq.output_ids) >= seq.req.max_new_tokens:
            return {"type": "length", "length": seq.req.max_new_tokens}
        return None

    def _finish(self, seq: Sequence, reason: dict) -> None:
        if seq.finished:
            return
        seq.finish_reason = reason
        if seq.req.return_routed_experts and seq.kv_len == len(seq.req.input_ids) + len(seq.output_ids) - 1:
            # every token a forward ran on: the prompt and the output but its last token (an abort
            # in the middle of a prefill has no such rows, and answers without routes)
            seq.routed_experts = self.runner.routed_experts(seq.pages, seq.kv_len)
        seq.text = self.decode(seq)
        matched = reason.get("matched")
        if isinstance(matched, str) and not seq.req.params.no_stop_trim:
            seq.text = seq.text[: seq.text.index(matched)]
        seq.notify(seq)

    def _cache(self, seq: Sequence) -> None:
        """Put the full pages of `seq`'s KV into the prefix cache. They are never written again:
        a sequence only writes positions past its KV, in its last (partial, uncached) page or new ones."""
        if self._shares_cache(seq) and seq.epoch == self.epoch:
            self.pool.insert((seq.req.input_ids + seq.output_ids)[: seq.kv_len], seq.pages)

    def _retire(self) -> None:
        """Drop finished sequences from the running batch; their full pages go to the prefix cache."""
        for seq in self.running:
            if seq.finished:
                self._cache(seq)
                self.pool.release(seq.pages)
                self.reserved -= seq.reserved
                seq.pages, seq.reserved = [], 0
        self.running = [s for s in self.running if not s.finished]

    def decode(self, seq: Sequence) -> str:
        """The output text so far; the stop check and the stream chunk of a step share one decode."""
        if seq.decoded[0] != len(seq.output_ids):
            text = self.runner.decode(seq.output_ids, skip_special_tokens=seq.req.params.skip_special_tokens)
            seq.decoded = (len(seq.output_ids), text)
        return seq.decoded[1]


def _parent(seq: Sequence) -> str:
    """The request id an `n > 1` sequence was expanded from (`rid-j` -> `rid`)."""
    return seq.req.rid.rsplit("-", 1)[0] if seq.req.params.n > 1 else seq.req.rid


def _eos_ids(runner: ModelRunner) -> set[int]:
    ids: set[int] = set()
    for source in (runner.model.generation_config, runner.model.config):
        eos = getattr(source, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else eos or [])
    if runner.tokenizer.eos_token_id is not None:
        ids.add(runner.tokenizer.eos_token_id)
    return ids
