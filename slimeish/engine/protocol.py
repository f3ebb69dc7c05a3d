"""SGLang's `/generate` protocol: validate a request body into sequences, render results back.

Key names, defaults and response shapes follow SGLang's native API (its schema ships in the
SGLang wheel as `sglang/api/v1/api_types.py`; tests check our output against it). Every user
error raises `RequestError`, which the HTTP layer answers with a 400 and the message.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import msgspec

# What the engine calls itself in /model_info: weight hand-over by shared memory needs this engine.
ENGINE_NAME = "slimeish"

# SGLang keys the embedded engine accepts only at their no-op default.
_NOOP_DEFAULTS: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "spaces_between_special_tokens": True,
}
# Top-level request fields that would change the output but are not implemented here.
_UNSUPPORTED_FIELDS = ("image_data", "video_data", "audio_data", "input_embeds", "custom_logit_processor")


class RequestError(ValueError):
    """A client error in a request body (HTTP 400)."""


class SamplingParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The subset of SGLang's sampling_params the embedded engine implements (same names and defaults)."""

    max_new_tokens: int | None = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1
    sampling_seed: int | None = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    spaces_between_special_tokens: bool = True

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


ACCEPTED_SAMPLING_KEYS = tuple(SamplingParams.__struct_fields__)


@dataclass(slots=True)
class SequenceRequest:
    """One sequence to generate: a prompt with its sampling params (a request with n=4 makes four)."""

    rid: str
    index: int  # position in the response list of its HTTP request
    input_ids: list[int]
    params: SamplingParams
    seed: int | None
    return_logprob: bool
    return_text_in_logprobs: bool
    max_new_tokens: int = 0  # resolved: max_new_tokens, or what the context leaves
    # resolved logprob_start_len: input positions >= it get `input_token_logprobs`; len(input_ids)
    # (SGLang's default, -1, with return_logprob) means none
    logprob_start: int | None = None
    return_routed_experts: bool = False  # MoE: meta_info.routed_experts, as SGLang's flag of that name
    lora_path: str | None = None  # the loaded LoRA adapter it generates with (SGLang's name); None: the base

    @property
    def prompt_logprob_start(self) -> int:
        """The first input position whose log-prob is asked for (len(input_ids) when none is)."""
        if not self.return_logprob or self.logprob_start is None:
            return len(self.input_ids)
        return self.logprob_start

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.prompt_logprob_start < len(self.input_ids)


def parse_sampling_params(raw: Any) -> SamplingParams:
    if raw is None:
        return SamplingParams()
    if not isinstance(raw, dict):
        raise RequestError(f"sampling_params must be an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(ACCEPTED_SAMPLING_KEYS))
    if unknown:
        raise RequestError(f"unknown sampling_params key(s) {unknown}; accepted keys: {list(ACCEPTED_SAMPLING_KEYS)}")
    try:
        # null means "default", as in SGLang; for max_new_tokens the default is then "up to the context".
        given = {k: v for k, v in raw.items() if v is not None or k == "max_new_tokens"}
        params = msgspec.convert(given, SamplingParams)
    except msgspec.ValidationError as e:
        raise RequestError(f"invalid sampling_params: {e}") from None
    _check_ranges(params)
    return params


def _check_ranges(p: SamplingParams) -> None:
    for key, default in _NOOP_DEFAULTS.items():
        if getattr(p, key) != default:
            raise RequestError(f"sampling_params.{key}={getattr(p, key)!r} is not supported by the embedded engine")
    checks = [
        (p.temperature >= 0, "temperature must be >= 0"),
        (0 < p.top_p <= 1, "top_p must be in (0, 1]"),
        (p.top_k == -1 or p.top_k >= 1, "top_k must be -1 (off) or >= 1"),
        (p.n >= 1, "n must be >= 1"),
        (p.max_new_tokens is None or p.max_new_tokens >= 0, "max_new_tokens must be >= 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise RequestError(message)


@dataclass(frozen=True, slots=True)
class Limits:
    vocab_size: int
    context_length: int
    max_sequences: int = 256  # per request: prompts x n
    moe: bool = False  # the model routes tokens to experts (return_routed_experts is answerable)
    adapters: Collection[str] = ()  # the LoRA adapters loaded now, a live view (`lora_path` names one)


def parse_generate(body: Any, tokenize, limits: Limits) -> tuple[list[SequenceRequest], bool, bool]:
    """Validate a `/generate` body; return its sequences, whether it is a batch, and whether to stream."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    for name in _UNSUPPORTED_FIELDS:
        if body.get(name) is not None:
            raise RequestError(f"{name} is not supported by the embedded engine")
    if body.get("top_logprobs_num") not in (None, 0) or body.get("token_ids_logprob") is not None:
        raise RequestError("top_logprobs_num and token_ids_logprob are not supported by the embedded engine")
    prompts, is_batch = _prompts(body, tokenize)
    params = _per_prompt(body.get("sampling_params"), len(prompts), is_batch, "sampling_params")
    logprob = _per_prompt(body.get("return_logprob"), len(prompts), is_batch, "return_logprob")
    rids = _per_prompt(body.get("rid"), len(prompts), is_batch, "rid")
    starts = _per_prompt(body.get("logprob_start_len"), len(prompts), is_batch, "logprob_start_len")
    stream = body.get("stream", False)
    text_in_logprobs = body.get("return_text_in_logprobs") or False
    routed = _per_prompt(body.get("return_routed_experts"), len(prompts), is_batch, "return_routed_experts")
    _check_type("stream", [stream], bool)
    _check_type("return_text_in_logprobs", [text_in_logprobs], bool)
    _check_type("return_routed_experts", routed, bool)
    if any(routed) and not limits.moe:
        raise RequestError("return_routed_experts needs a Mixture-of-Experts model; this one is dense")
    _check_type("return_logprob", logprob, bool)
    _check_type("rid", rids, str)
    _check_type("logprob_start_len", starts, int)
    loras = _per_prompt(body.get("lora_path"), len(prompts), is_batch, "lora_path")
    _check_type("lora_path", loras, str)
    if unknown := sorted(set(loras) - {None} - set(limits.adapters)):
        raise RequestError(f"lora_path {unknown} names no loaded LoRA adapter (POST /load_lora_adapter first); "
                           f"loaded: {sorted(limits.adapters)}")  # fmt: skip
    parsed = [parse_sampling_params(raw) for raw in params]
    if (total := sum(p.n for p in parsed)) > limits.max_sequences:
        raise RequestError(
            f"the request asks for {total} sequences (prompts x n); this engine serves at most "
            f"{limits.max_sequences} per request (--max-request-sequences)"
        )
    seqs: list[SequenceRequest] = []
    for i, ids in enumerate(prompts):
        p = parsed[i]
        _check_prompt(ids, p, limits)
        start = _logprob_start(starts[i], len(ids))
        want_logprob = bool(logprob[i])
        base_rid = str(rids[i]) if rids[i] is not None else uuid.uuid4().hex
        for j in range(p.n):
            seqs.append(
                SequenceRequest(
                    rid=base_rid if p.n == 1 else f"{base_rid}-{j}",
                    index=len(seqs),
                    input_ids=ids,
                    params=p,
                    seed=None if p.sampling_seed is None else p.sampling_seed + j,
                    return_logprob=want_logprob,
                    return_text_in_logprobs=text_in_logprobs,
                    return_routed_experts=bool(routed[i]),
                    max_new_tokens=limits.context_length - len(ids) if p.max_new_tokens is None else p.max_new_tokens,
                    logprob_start=start,
                    lora_path=loras[i],
                )
            )
    return seqs, is_batch or len(seqs) > 1, stream


def _prompts(body: dict, tokenize) -> tuple[list[list[int]], bool]:
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise RequestError("give exactly one of text or input_ids")
    if ids is not None:
        if _is_int_list(ids):
            return [ids], False
        if isinstance(ids, list) and ids and all(_is_int_list(x) for x in ids):
            return list(ids), True
        raise RequestError("input_ids must be a list of ints or a non-empty list of such lists")
    if isinstance(text, str):
        return [tokenize(text)], False
    if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
        return [tokenize(t) for t in text], True
    raise RequestError("text must be a string or a non-empty list of strings")


def _logprob_start(value: int | None, n_input: int) -> int | None:
    """SGLang's `logprob_start_len`: -1 (or absent) asks for output log-probs only."""
    if value is None or value == -1:
        return None
    if not 0 <= value <= n_input:
        raise RequestError(
            f"logprob_start_len={value} must be -1 (output log-probs only) or in [0, {n_input}] "
            f"(the number of input tokens)"
        )
    return value


def _check_type(name: str, values: list[Any], tp: type) -> None:
    if any(v is not None and not isinstance(v, tp) for v in values):
        raise RequestError(f"{name} must be a {tp.__name__} (or, for a batch, a list with one per prompt)")


def _is_int_list(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def _per_prompt(value: Any, n: int, is_batch: bool, name: str) -> list[Any]:
    """SGLang allows one value for all prompts of a batch, or a list with one per prompt."""
    if is_batch and isinstance(value, list):
        if len(value) != n:
            raise RequestError(f"{name} has {len(value)} entries for {n} prompts")
        return value
    return [value] * n


def _check_prompt(ids: list[int], p: SamplingParams, limits: Limits) -> None:
    if not ids:
        raise RequestError("the prompt is empty")
    bad = [t for t in ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise RequestError(f"token ids {bad[:5]} are outside the vocabulary [0, {limits.vocab_size})")
    bad_stop = [t for t in p.stop_token_ids or [] if not 0 <= t < limits.vocab_size]
    if bad_stop:
        raise RequestError(f"stop_token_ids {bad_stop[:5]} are outside the vocabulary [0, {limits.vocab_size})")
    max_new = 0 if p.max_new_tokens is None else p.max_new_tokens
    if len(ids) + max_new > limits.context_length or len(ids) >= limits.context_length:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of {limits.context_length} tokens. "
            f"You requested a total of {len(ids) + max_new} tokens: {len(ids)} tokens from the input and "
            f"{max_new} tokens for the completion (max_new_tokens)."
        )
