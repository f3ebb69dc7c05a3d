"""Plugins written the way slime's examples write them (a multi-turn tool loop that posts to the
router's root /generate itself and builds the sample's tokens, loss mask and log-probs by hand),
with only `slime.` changed to `slimeish.` in the imports."""

import copy

from slimeish.rollout.sglang_rollout import GenerateState
from slimeish.utils.http_utils import post
from slimeish.utils.types import Sample

TOOL_RESULT = "\n<result>42</result>\n"


async def generate_with_tool(args, sample: Sample, sampling_params) -> Sample:
    """Two sampled turns with a tool result between them: mask 1 on sampled tokens, 0 on the result."""
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    prompt_ids = state.tokenizer.apply_chat_template(sample.prompt, add_generation_prompt=True, tokenize=True)
    if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
        prompt_ids = list(prompt_ids["input_ids"])
    response_ids: list[int] = []
    loss_mask: list[int] = []
    log_probs: list[float] = []
    for turn in range(2):
        payload = {"input_ids": prompt_ids + response_ids, "sampling_params": sampling_params, "return_logprob": True}
        output = await post(url, payload)
        meta = output["meta_info"]
        response_ids += [item[1] for item in meta["output_token_logprobs"]]
        log_probs += [item[0] for item in meta["output_token_logprobs"]]
        loss_mask += [1] * len(meta["output_token_logprobs"])
        sample.weight_versions.append(meta["weight_version"])
        sample.response += output["text"]
        if turn == 0:
            obs_ids = state.tokenizer(TOOL_RESULT, add_special_tokens=False)["input_ids"]
            response_ids += obs_ids
            log_probs += [0.0] * len(obs_ids)
            loss_mask += [0] * len(obs_ids)
            sample.response += TOOL_RESULT
    sample.tokens = prompt_ids + response_ids
    sample.response_length = len(response_ids)
    sample.loss_mask = loss_mask
    sample.rollout_log_probs = log_probs
    sample.status = Sample.Status.TRUNCATED if meta["finish_reason"]["type"] == "length" else Sample.Status.COMPLETED
    return sample


async def generate_two_samples(args, sample: Sample, sampling_params) -> list[Sample]:
    """slime's list return: two one-turn samples of the same prompt, scored by the generate itself."""
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    samples = [sample, copy.deepcopy(sample)]
    for s in samples:
        prompt_ids = state.tokenizer.apply_chat_template(s.prompt, add_generation_prompt=True, tokenize=True)
        if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
            prompt_ids = list(prompt_ids["input_ids"])
        s.tokens = list(prompt_ids)
        output = await post(url, {"input_ids": prompt_ids, "sampling_params": sampling_params, "return_logprob": True})
        meta = output["meta_info"]
        s.append_response_tokens(
            args,
            tokens=[t for _, t, _ in meta["output_token_logprobs"]],
            log_probs=[lp for lp, _, _ in meta["output_token_logprobs"]],
            meta_info=meta,
            text=output["text"],
        )
        s.reward = float(sample.index % 2)
    return samples


def sft_rollout(args, rollout_id, data_source, evaluation=False):
    """An SFT rollout the way slime's is written: each prompt is a whole conversation; its tokens
    and loss mask come from the mask generator, with no rollout log-probs and a reward of 0."""
    from slimeish.utils.mask_utils import MultiTurnLossMaskGenerator
    from slimeish.utils.processing_utils import load_processor, load_tokenizer

    assert not evaluation and args.rollout_global_dataset
    tokenizer = load_tokenizer(args.hf_checkpoint)
    assert load_processor(args.hf_checkpoint) is None
    generator = MultiTurnLossMaskGenerator(tokenizer, tokenizer_type=args.loss_mask_type)
    groups = data_source.get_samples(args.rollout_batch_size)
    for group in groups:
        (sample,) = group
        token_ids, loss_mask = generator.get_loss_mask(sample.prompt, tools=sample.metadata.get("tools"))
        response_length = generator.get_response_lengths([loss_mask])[0]
        sample.tokens = token_ids
        sample.response_length = response_length
        sample.reward = 0
        sample.loss_mask = loss_mask[-response_length:]
    return groups


async def teacher_logprob_reward(args, sample: Sample, **kwargs) -> dict:
    """An on-policy distillation reward in slime's style: the teacher at --rm-url scores the
    whole sequence (no new tokens, every input position's log-prob); its answer is the raw reward."""
    payload = {
        "input_ids": sample.tokens,
        "sampling_params": {"temperature": args.rollout_temperature, "max_new_tokens": 0, "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    return await post(args.rm_url, payload)


def teacher_logprobs_post_process(args, samples: list[Sample], **kwargs):
    """Keep the response's part of each teacher answer as `teacher_log_probs`; reward 0 (pure distillation)."""
    import torch

    for sample in samples:
        entries = sample.get_reward_value(args)["meta_info"]["input_token_logprobs"][1:]
        sample.teacher_log_probs = torch.tensor([e[0] for e in entries], dtype=torch.float32)[-sample.response_length :]
    rewards = [0.0] * len(samples)
    return rewards, rewards
