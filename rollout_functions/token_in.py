"""Token-in/token-out rollout (slime's default): n samples per prompt through the router's /generate.

Each sample's prompt is rendered with the model's chat template (a list of messages) or used as
raw text (a string), tokenized once, and sent as `input_ids` to the session's `/generate`; the
router captures the sampled ids and logprobs. `--custom-generate-function-path` replaces the
per-sample generate (slime's `async def generate(args, sample, sampling_params) -> Sample`, or a
`list[Sample]`; the session is in `sample.metadata["session"]`), and `--custom-rm-path` scores each sample.
"""

from __future__ import annotations

import functools
from typing import Any

from slimeish.common.finish import finish_type, sample_status
from slimeish.common.sample import Sample, Status
from slimeish.rollout import (
    RolloutFnEvalOutput,
    RolloutFnTrainOutput,
    generated_samples,
    load_generate_function,
    load_reward_function,
    sampling_params,
)
from slimeish.rollout.rewards import set_reward
from slimeish.rollout.sample_hooks import apply_sample_hooks, load_sample_hooks
from slimeish.rollout_functions.sessions import Session, router_sessions, run_episodes


@functools.cache
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def prompt_ids(args: Any, prompt: str | list[dict[str, Any]]) -> list[int]:
    tok = _tokenizer(str(args.hf_checkpoint))
    if isinstance(prompt, str):
        return tok.encode(prompt)
    encoded = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(encoded["input_ids"])


async def generate(args: Any, sample: Sample, params: dict[str, Any]) -> Sample:
    """Default per-sample generate: one token-in turn on the sample's session."""
    ids = prompt_ids(args, sample.prompt)
    body = {"input_ids": ids, "sampling_params": params, "return_logprob": True}
    url = sample.metadata["session"]["generate_url"]
    r = await router_sessions().send("POST", url, admin=False, json=body)  # retried on 503: engines restarting
    r.raise_for_status()
    out = r.json()
    meta = out["meta_info"]
    output_ids = out["output_ids"]
    sample.tokens = ids + output_ids
    sample.response = out["text"]
    sample.response_length = len(output_ids)
    sample.loss_mask = [1] * len(output_ids)
    sample.rollout_log_probs = [lp for lp, _, _ in meta["output_token_logprobs"]]
    sample.weight_versions = [int(meta["weight_version"])]
    sample.status = sample_status(finish_type(meta))
    return sample


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    gen = load_generate_function(args.custom_generate_function_path) if args.custom_generate_function_path else generate
    rm = load_reward_function(args.custom_rm_path) if args.custom_rm_path else None
    if rm is None and gen is generate:
        raise ValueError(
            "slimeish.rollout_functions.token_in needs --custom-rm-path: the default generate sets no reward"
        )
    params = sampling_params(args, evaluation=evaluation)
    hooks = load_sample_hooks(args.rollout_sample_hook_path)

    async def episode(session: Session, sample: Sample) -> list[Sample]:
        sample.metadata["session"] = {"session_id": session.session_id, "generate_url": session.generate_url}
        source = f"the generate function {args.custom_generate_function_path}"
        samples = generated_samples(await gen(args, sample, dict(params)), source)
        samples = [
            await apply_sample_hooks(hooks, args, s, rollout_id=rollout_id, evaluation=evaluation) for s in samples
        ]
        for s in samples:
            if s.reward is not None:  # the generate function scored it itself (slime skips the reward function)
                set_reward(args, s, s.reward, source)
            elif rm is not None and s.status != Status.FAILED:
                set_reward(args, s, await rm(args, s), f"the reward function {args.custom_rm_path}")
        return samples

    return run_episodes(args, data_source, episode, rollout_id=rollout_id, evaluation=evaluation)
