"""slime's rollout machinery for plugins, under slime's names (`from slime.rollout.sglang_rollout import
...`): `GenerateState` (the tokenizer, the rollout's sampling params and the concurrency bound,
built once per run), `generate` (one token-in turn on the router's root `/generate`, which
answers as the engine does, uncaptured: `slimeish train` records the returned tokens), and
`generate_and_rm` / `generate_and_rm_group` (generate with --custom-generate-function-path or
that default, then score with --custom-rm-path or the built-in `rm_hub.async_rm`)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from slimeish.common.async_http import post
from slimeish.common.finish import finish_type, sample_status
from slimeish.common.sample import Sample, Status
from slimeish.rollout import generated_samples, load_generate_function, load_reward_function, sampling_params
from slimeish.rollout.rewards import set_reward
from slimeish.rollout.rm_hub import async_rm


@functools.cache
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class GenerateState:
    """One per `args` (slime's singleton): `tokenizer`, `processor` (None: no multimodal processor
    here), `sampling_params` (SGLang names) and `semaphore` (`--rollout-concurrency`)."""

    def __new__(cls, args: Any) -> GenerateState:
        state = _STATES.get(id(args))
        if state is None:
            state = _STATES[id(args)] = super().__new__(cls)
            state._init(args)
        return state

    def _init(self, args: Any) -> None:
        self.args = args
        self.tokenizer = _tokenizer(str(args.hf_checkpoint))
        self.processor = None
        self.sampling_params: dict[str, Any] = sampling_params(args) | {
            "stop_token_ids": getattr(args, "rollout_stop_token_ids", None),
            "skip_special_tokens": getattr(args, "rollout_skip_special_tokens", False),
            "no_stop_trim": True,
        }
        self.semaphore = asyncio.Semaphore(args.rollout_concurrency)


_STATES: dict[int, GenerateState] = {}


def get_model_url(args: Any, model_name: str = "default", endpoint: str = "/generate") -> str:
    """The router URL of a model (one model here: the policy)."""
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}{endpoint}"


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """slime's default generate: the prompt's token ids (chat-templated when it is a message list)
    to the router's `/generate`, the answer's tokens and log-probs onto the sample."""
    tokenizer = GenerateState(args).tokenizer
    if isinstance(sample.prompt, str):
        ids = tokenizer.encode(sample.prompt)
    else:
        ids = list(tokenizer.apply_chat_template(sample.prompt, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"])  # fmt: skip
    body = {"input_ids": ids, "sampling_params": sampling_params, "return_logprob": True}
    out = await post(get_model_url(args), body)
    meta, output_ids = out["meta_info"], out["output_ids"]
    sample.tokens, sample.response = ids + output_ids, out["text"]
    sample.response_length, sample.loss_mask = len(output_ids), [1] * len(output_ids)
    sample.rollout_log_probs = [lp for lp, _, _ in meta["output_token_logprobs"]]
    sample.weight_versions = [int(meta["weight_version"])]
    sample.status = sample_status(finish_type(meta))
    return sample


async def generate_and_rm(
    args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False
) -> Sample | list[Sample]:
    """One sample generated (bounded by `GenerateState.semaphore`), then scored unless the generate
    function scored it or it failed."""
    path = args.custom_generate_function_path
    gen = load_generate_function(path) if path else generate
    async with GenerateState(args).semaphore:
        out = await gen(args, sample, dict(sampling_params))
    samples = generated_samples(out, f"the generate function {path}")
    rm = load_reward_function(args.custom_rm_path) if args.custom_rm_path else async_rm
    for s in samples:
        if s.reward is None and s.status != Status.FAILED:
            set_reward(args, s, await rm(args, s), f"the reward function {args.custom_rm_path or 'async_rm'}")
    return out  # as the generate function returned it: a Sample, or the member's list


async def generate_and_rm_group(
    args: Any, group: list[Sample], sampling_params: dict[str, Any], evaluation: bool = False
) -> list[Sample | list[Sample]]:
    """Every member of a group through `generate_and_rm`, concurrently; each as its generate returned it."""
    return list(await asyncio.gather(*(generate_and_rm(args, s, sampling_params, evaluation) for s in group)))
