"""The helpers slime plugins import, under slimeish's mirrored paths, used as a plugin uses them:
the generate state and `post` against the router's root /generate, and slime's `args` names."""

import argparse
import asyncio

from slimeish.rollout.sglang_rollout import GenerateState, get_model_url
from slimeish.train.setup import SLIME_ARGS, parse_args, plugin_args
from slimeish.utils.http_utils import post
from slimeish.utils.types import Sample


def plugin_style_generate(args, sample, sampling_params):
    """A search-tool-style generate, cut to one turn: text in, exact tokens and log-probs out."""

    async def run():
        state = GenerateState(args)
        prompt_ids = state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
        sample.tokens = list(prompt_ids)
        out = await post(get_model_url(args), {"text": sample.prompt, "sampling_params": sampling_params,
                                               "return_logprob": True})  # fmt: skip
        pairs = out["meta_info"]["output_token_logprobs"]
        sample.append_response_tokens(args, tokens=[t for _, t, _ in pairs], log_probs=[lp for lp, _, _ in pairs],
                                      meta_info=out["meta_info"], text=out["text"])  # fmt: skip
        return sample

    return asyncio.run(run())


def test_a_plugin_generates_through_the_routers_root_generate(router_app, tiny_model):
    host, port = router_app.url.removeprefix("http://").split(":")
    args = argparse.Namespace(**SLIME_ARGS, hf_checkpoint=tiny_model, sglang_router_ip=host,
                              sglang_router_port=int(port), rollout_concurrency=4, rollout_max_response_len=4,
                              rollout_temperature=1.0, rollout_top_p=1.0, rollout_top_k=-1, rollout_stop=[],
                              eval_temperature=0.0)  # fmt: skip
    state = GenerateState(args)
    assert state is GenerateState(args) and state.sampling_params["max_new_tokens"] == 4
    sample = plugin_style_generate(args, Sample(prompt="hello"), dict(state.sampling_params))
    assert 0 < sample.response_length <= 4 and sample.loss_mask == [1] * sample.response_length
    assert len(sample.rollout_log_probs) == sample.response_length and sample.status != Sample.Status.PENDING


def test_args_carry_slimes_attribute_names(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a", "label": "a"}\n')
    setup = parse_args(["--model-path", str(tmp_path), "--prompt-data", str(prompts), "--reward-key", "acc"])
    args = plugin_args(setup, "http://127.0.0.1:9", "t")
    assert args.partial_rollout is False and args.rollout_global_dataset is True and args.rm_url is None
    assert args.reward_key == "acc" and args.hf_checkpoint == str(tmp_path) and args.sglang_router_port == 9
