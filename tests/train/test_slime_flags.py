"""slime's launch-script flags on `slimeish train`: each is slimeish's own, renamed to it, carried
onto `args`, or refused at start-up with what to use instead (slimeish.train.slime_flags)."""

import dataclasses
import json
from pathlib import Path

import pytest

from slimeish.data import DataConfig, read_prompts
from slimeish.rollout import sampling_params
from slimeish.train.setup import CONFIGS, parse_args, plugin_args
from slimeish.train.slime_flags import RULES, refusal

# The flags of slime's own argument parser (slime/utils/arguments.py, names only).
SLIME_FLAGS = (Path(__file__).parent / "slime_flag_names.txt").read_text().split()

SLIME_LAUNCH = """
--hf-checkpoint {model} --prompt-data {data} --input-key question --label-key answer --tool-key tools
--metadata-key extra --apply-chat-template --rollout-shuffle --rollout-seed 7 --num-rollout 3
--rollout-batch-size 2 --n-samples-per-prompt 4 --global-batch-size 8 --over-sampling-batch-size 4
--rollout-max-response-len 16 --rollout-max-context-len 256 --rollout-temperature 0.8 --rollout-top-p 0.9
--rollout-top-k 20 --rollout-stop-token-ids 5 6 --custom-rm-path tests.train.reference_plugins.reward
--rm-type math --rm-url http://rm:1 --reward-key acc
--dynamic-sampling-filter-path slimeish.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std
--advantage-estimator gspo --use-kl-loss --kl-loss-coef 0.01 --kl-loss-type low_var_kl --entropy-coef 0.0
--eps-clip 0.2 --eps-clip-high 0.28 --use-tis --tis-clip 2.5 --loss-type policy_loss --lr 1e-6
--lr-warmup-iters 2 --tensor-model-parallel-size 1 --expert-model-parallel-size 2 --max-tokens-per-gpu 2048
--use-dynamic-batch-size
--eval-prompt-data aime {data} --n-samples-per-eval-prompt 2 --loss-mask-type qwen3
"""


def _launch(tmp_path: Path, extra: str = "") -> list[str]:
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"question": "hi", "answer": "a", "tools": []}) + "\n")
    return (SLIME_LAUNCH + extra).format(model=tmp_path, data=data).split()


def test_a_slime_launch_line_parses_into_the_setup(tmp_path):
    setup = parse_args(_launch(tmp_path))
    assert setup.trainer.model_path == tmp_path and setup.trainer.micro_batch_tokens == 2048
    assert setup.trainer.lr_warmup_steps == 2 and setup.trainer.global_batch_size == 8
    assert setup.trainer.expert_model_parallel_size == 2  # slimeish's own flag
    assert (setup.data.input_key, setup.data.label_key, setup.data.metadata_key) == ("question", "answer", "extra")
    assert setup.data.apply_chat_template and setup.data.tokenizer_path == tmp_path
    assert setup.data.shuffle and setup.data.shuffle_seed == 7
    assert setup.data.eval_prompt_data == tmp_path / "p.jsonl"
    r = setup.rollout
    assert (r.rollout_batch_size, r.n_samples_per_prompt, r.rollout_max_response_len) == (2, 4, 16)
    assert (r.rollout_temperature, r.rollout_top_p, r.rollout_top_k, r.reward_key) == (0.8, 0.9, 20, "acc")
    loss = setup.loss
    assert (loss.advantage_estimator, loss.policy_loss, loss.kl_coef, loss.kl_estimator) == ("grpo", "gspo", 0.01, "k3")
    assert loss.tis and loss.tis_clip_high == 2.5 and loss.eps_clip_high == 0.28
    args = plugin_args(setup, "http://127.0.0.1:9", "t")
    assert (args.rm_type, args.rm_url, args.rollout_max_context_len) == ("math", "http://rm:1", 256)
    assert args.rollout_stop_token_ids == [5, 6] and args.over_sampling_batch_size == 4
    assert args.loss_mask_type == "qwen3" and args.apply_chat_template and args.tool_key == "tools"
    assert args.partial_rollout is False and args.rollout_skip_special_tokens is False
    # slime's names for slimeish's values, read by tool loops for their context budget
    assert (args.max_tokens_per_gpu, args.context_parallel_size, args.tensor_model_parallel_size) == (2048, 1, 1)
    assert args.rollout_shuffle is True and args.rollout_seed == 7


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("--colocate", "--num-engines"),
        ("--partial-rollout", "--failed-policy"),
        ("--rollout-num-gpus-per-engine 2", "--engine-url"),
        ("--sglang-mem-fraction-static 0.8", "--engine-url"),
        ("--use-wandb", "metrics.jsonl"),
        ("--seq-length 4096", "config.json"),
        ("--async-save", "--save-interval"),
        ("--advantage-estimator ppo", "grpo and dr_grpo"),
        ("--pipeline-model-parallel-size 2", "--tensor-parallel"),
        ("--attention-dropout 0.1", "without dropout"),
        ("--optimizer sgd", "AdamW"),
    ],
)
def test_a_refused_slime_flag_exits_2_saying_what_to_use(tmp_path, capsys, flag, says):
    with pytest.raises(SystemExit) as exc:
        parse_args(_launch(tmp_path, " " + flag))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag.split()[0] in err and says in err


def test_every_slime_flag_is_taken_or_refused():
    ours = {"--" + f.name.replace("_", "-") for cls in CONFIGS.values() for f in dataclasses.fields(cls)}
    unhandled = [f for f in SLIME_FLAGS if f not in ours and f not in RULES and refusal(f) is None]
    assert unhandled == []


def test_apply_chat_template_renders_prompts_with_tools(tmp_path, tiny_model):
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"input": "what is 2+2?", "tools": json.dumps(tools)}) + "\n")
    cfg = DataConfig(input_key="input", apply_chat_template=True, tokenizer_path=tiny_model)
    (sample,) = read_prompts(path, cfg)
    assert isinstance(sample.prompt, str) and "what is 2+2?" in sample.prompt and '"search"' in sample.prompt
    assert sample.metadata["tools"] == tools
    (plain,) = read_prompts(path, DataConfig(input_key="input"))
    assert plain.prompt == "what is 2+2?" and plain.metadata["tools"] == tools


def test_slimeish_values_of_a_translated_flag_still_parse(tmp_path):
    setup = parse_args([*_launch(tmp_path)[:4], "--advantage-estimator", "dr_grpo", "--eval-prompt-data", "e.jsonl"])
    assert setup.loss.advantage_estimator == "dr_grpo" and setup.data.eval_prompt_data == Path("e.jsonl")


def test_flags_that_change_nothing_here_are_accepted_saying_so(tmp_path, capsys):
    """A search-tool example's PERF/MISC flags: Megatron tuning and no-op parallel sizes."""
    extra = (
        " --sequence-parallel --pipeline-model-parallel-size 1 --context-parallel-size 1 --recompute-granularity full"
        " --recompute-method uniform --attention-dropout 0.0 --hidden-dropout 0.0 --optimizer adam --ref-load /ref"
        " --accumulate-allreduce-grads-in-fp32 --attention-backend flash --balance-data"
    )
    setup = parse_args(_launch(tmp_path, extra))
    assert setup.trainer.micro_batch_tokens == 2048
    err = capsys.readouterr().err
    for flag in ("--sequence-parallel", "--recompute-granularity", "--attention-dropout", "--ref-load"):
        assert f"{flag} (slime) accepted:" in err
    assert "--use-dynamic-batch-size (slime) accepted: micro-batches are always packed" in err


def test_slimes_eval_sampling_flags_set_the_evaluation_params(tmp_path):
    """A math-tool example's EVAL_ARGS: eval sampling overrides, each unset one keeping the rollout's."""
    extra = " --eval-max-response-len 32 --eval-top-p 0.5 --eval-interval 20"
    setup = parse_args(_launch(tmp_path, extra))
    evaluation = sampling_params(setup.rollout, evaluation=True)
    assert (evaluation["max_new_tokens"], evaluation["top_p"], evaluation["top_k"]) == (32, 0.5, 20)
    assert evaluation["temperature"] == 0.0 and setup.run.eval_interval == 20
    training = sampling_params(setup.rollout)
    assert (training["max_new_tokens"], training["top_p"], training["temperature"]) == (16, 0.9, 0.8)


def test_num_epoch_sets_the_rollout_steps_unless_num_rollout_is_given(tmp_path):
    """slime's --num-epoch: num_epoch x prompts // rollout_batch_size; a --num-rollout given wins."""
    launch = [a for a in _launch(tmp_path) if a != "--num-rollout"]
    launch.remove("3")  # --num-rollout's value
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"question": f"q{i}", "answer": "a"}) + "\n" for i in range(5)))
    assert parse_args([*launch, "--num-epoch", "3"]).run.num_rollout == 7  # 3 x 5 // 2
    assert parse_args([*launch, "--num-epoch", "3", "--num-rollout", "4"]).run.num_rollout == 4


def test_slimes_sft_mode_flags_are_taken(tmp_path, capsys):
    extra = " --loss-type sft_loss --disable-compute-advantages-and-returns --debug-train-only"
    setup = parse_args([a for a in _launch(tmp_path, extra) if a not in ("--use-tis", "--tis-clip", "2.5")])
    assert setup.loss.loss_type == "sft_loss" and setup.loss.compute_advantages is False
    assert "--debug-train-only (slime) accepted: engines start anyway" in capsys.readouterr().err
    assert parse_args(_launch(tmp_path, " --debug-rollout-only")).run.debug_rollout_only


def test_disabled_advantages_with_the_policy_loss_exit_2_saying_why(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(_launch(tmp_path, " --disable-compute-advantages-and-returns"))
    assert "only --loss-type sft_loss" in capsys.readouterr().err
