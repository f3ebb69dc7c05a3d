"""Render sequences as SGLang `/generate` responses and stream chunks."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from slimeish.common.routed_experts import encode_routed_experts

if TYPE_CHECKING:
    from slimeish.engine.scheduler import Scheduler, Sequence


def render(seq: Sequence, sched: Scheduler, *, index: int | None, text: str | None = None) -> dict:
    """One response object. Stream chunks use it too: as in SGLang's default (non-incremental)
    streaming, each chunk holds everything so far (text, output_ids, logprobs), not a delta."""
    ids = seq.output_ids
    spans = seq.weight_spans
    meta: dict[str, Any] = {
        "id": seq.req.rid,
        "finish_reason": seq.finish_reason,
        "prompt_tokens": len(seq.req.input_ids),
        "completion_tokens": len(seq.output_ids),
        "cached_tokens": seq.cached_tokens,
        # SGLang's schema has the version as a string
        "weight_version": str(spans[-1][0] if spans else sched.version_of(seq)),
        "weight_versions": [{"version": str(v), "start": a, "end": b} for v, a, b in spans],
        "e2e_latency": time.monotonic() - seq.started_at,
    }
    if seq.req.return_logprob:
        texts = [_token_text(sched, t) for t in ids] if seq.req.return_text_in_logprobs else [None] * len(ids)
        meta["output_token_logprobs"] = [[lp, t, s] for lp, t, s in zip(seq.logprobs, ids, texts, strict=True)]
        meta["input_token_logprobs"] = _input_logprobs(seq, sched)
    if seq.routed_experts is not None:
        meta["routed_experts"] = encode_routed_experts(seq.routed_experts)
    out: dict[str, Any] = {"text": seq.text if text is None else text, "output_ids": ids, "meta_info": meta}
    if index is not None:
        out["index"] = index
    return out


def _input_logprobs(seq: Sequence, sched: Scheduler) -> list[list]:
    """SGLang's `input_token_logprobs`: input positions from logprob_start_len on, the first input
    token's log-prob None (nothing precedes it)."""
    prompt = seq.req.input_ids[seq.req.prompt_logprob_start :]
    logprobs: list[float | None] = [None] * (len(prompt) - len(seq.input_logprobs)) + list(seq.input_logprobs)
    texts = [_token_text(sched, t) for t in prompt] if seq.req.return_text_in_logprobs else [None] * len(prompt)
    return [[lp, t, s] for lp, t, s in zip(logprobs, prompt, texts, strict=True)]


def _token_text(sched: Scheduler, token: int) -> str:
    return sched.runner.decode([token])
