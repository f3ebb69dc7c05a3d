"""The scheduler: which sequences run each step, iteration-level (continuous) batching.

Every step (1) admits waiting sequences into free KV rows and prefills them together, (2) decodes
one token for every sequence already running, all in one batched forward, and (3) retires the
finished ones, freeing their rows for the next step. A short request therefore never waits for an
unrelated long one; it joins the batch at the next step and leaves as soon as it is done.

The loop runs as a task on the server's event loop: a step is synchronous (a few ms on CPU), and
the loop yields between steps so HTTP handlers, pauses and weight updates run only between steps,
never during a forward. Pausing stops stepping without touching any sequence (SGLang's in-place
pause), so paused requests resume where they were.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from slimeish.engine.model_runner import ModelRunner
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

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Scheduler:
    def __init__(self, runner: ModelRunner, *, max_rows: int, max_prefill_tokens: int, weight_version: int):
        self.runner = runner
        self.max_rows = max_rows
        self.max_prefill_tokens = max_prefill_tokens
        self.weight_version = weight_version
        self.eos_ids = _eos_ids(runner)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # running[i] owns KV row i
        self.paused = False
        self._wake = asyncio.Event()

    # ---- requests in and out -------------------------------------------------------------
    def submit(self, req: SequenceRequest, notify: Callable[[Sequence], None]) -> Sequence:
        seed = req.seed if req.seed is not None else random.getrandbits(63)
        p = req.params
        seq = Sequence(req, notify, random.Random(seed), RowSampling(p.temperature, p.top_p, p.top_k))
        if req.max_new_tokens == 0 and not req.wants_prompt_logprobs:
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

    def step(self) -> None:
        decoding = len(self.running)
        admitted = self._admit()
        if admitted:
            self._prefill(admitted, decoding)
        if decoding:
            batch = self.running[:decoding]
            last = [[s.output_ids[-1]] for s in batch]
            starts = [len(s.req.input_ids) + len(s.output_ids) - 1 for s in batch]
            self._append(batch, self.runner.forward(last, 0, starts))
        self._retire()

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        budget = self.max_prefill_tokens
        while self.waiting and len(self.running) < self.max_rows:
            n = len(self.waiting[0].req.input_ids)
            if admitted and n > budget:
                break
            budget -= n
            seq = self.waiting.popleft()
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def _prefill(self, admitted: list[Sequence], first_row: int) -> None:
        prompts = [s.req.input_ids for s in admitted]
        starts = [s.req.prompt_logprob_start for s in admitted]
        logits, prompt_logprobs = self.runner.prefill(prompts, first_row, starts)
        generating = []
        for row, (seq, logprobs) in enumerate(zip(admitted, prompt_logprobs, strict=True)):
            seq.input_logprobs = logprobs
            if seq.req.max_new_tokens == 0:  # a scoring request: the prompt's log-probs only
                self._finish(seq, {"type": "length", "length": 0})
            else:
                generating.append(row)
        if generating:
            self._append([admitted[i] for i in generating], logits[generating])

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

    def _note_version(self, seq: Sequence) -> None:
        n = len(seq.output_ids)
        if seq.weight_spans and seq.weight_spans[-1][0] == self.weight_version:
            seq.weight_spans[-1][2] = n
        else:
            seq.weight_spans.append([self.weight_version, n - 1, n])

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
        seq.text = self.decode(seq)
        matched = reason.get("matched")
        if isinstance(matched, str) and not seq.req.params.no_stop_trim:
            seq.text = seq.text[: seq.text.index(matched)]
        seq.notify(seq)

    def _retire(self) -> None:
        """Drop finished sequences from the running batch, keeping KV rows compact."""
        for row in range(len(self.running) - 1, -1, -1):
            if self.running[row].finished:
                last = len(self.running) - 1
                if row != last:
                    self.runner.move_row(last, row)
                    self.running[row] = self.running[last]
                self.running.pop()

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
