"""SGLang's `/generate`, as the router sends and reads it: the request, the sampling params and
the reply (one item, or one chunk of a stream), typed once here. Only the fields the router sets
or reads are named; the token-in path passes a client's other SGLang fields on as sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Required, TypedDict

from slimeish.router.jsontypes import TokenLogprob


class SamplingParams(TypedDict, total=False):
    max_new_tokens: int
    n: int
    temperature: float
    top_p: float
    top_k: int
    stop: list[str]
    sampling_seed: int


class GenerateRequest(TypedDict, total=False):
    input_ids: Required[list[int]]
    sampling_params: Required[SamplingParams]
    return_logprob: bool
    return_routed_experts: bool  # the experts of each token (MoE routing replay)
    lora_path: str  # the LoRA adapter to sample with (SGLang's name for a loaded adapter)
    top_logprobs_num: int
    stream: bool


class FinishReason(TypedDict, total=False):
    type: str  # "stop" | "length" | "abort"
    matched: int | str | None  # the stop string, or a stop token's id


class WeightSpan(TypedDict):
    version: int | str


class MetaInfo(TypedDict, total=False):
    finish_reason: FinishReason | None
    output_token_logprobs: list[TokenLogprob]  # [logprob, token id, text | null] per output token
    output_top_logprobs: list[list[TokenLogprob] | None]
    weight_version: int | str  # the engine's version as it answered (SGLang sends a string)
    weight_versions: list[WeightSpan]  # the versions the output was sampled under, when it changed mid-way
    routed_experts: str
    prompt_tokens: int


class GenerateReply(TypedDict, total=False):
    """One generated item; a streamed chunk has the same fields, cumulative so far."""

    text: str
    output_ids: list[int]
    index: int  # the choice a streamed chunk belongs to
    meta_info: MetaInfo


Answer = GenerateReply | list[GenerateReply]  # a non-streamed answer: a list when the request asked for n > 1
EngineChunks = AsyncIterator[tuple[GenerateReply, str]]  # (SGLang's cumulative chunk, the engine's url)
