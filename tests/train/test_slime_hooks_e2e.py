"""slime's hooks through `slimeish train`: a dict reward resolved by --reward-key, and slime's
zero-variance dynamic filter dropping groups, counted in metrics.jsonl."""

import asyncio
import json
import sys

import pytest

from slimeish.buffer import Buffer
from slimeish.common.sample import Sample
from tests.train.test_train_e2e import ledger, metrics, run_train, train_argv

pytestmark = pytest.mark.slow


def test_dynamic_filter_drops_zero_variance_groups_and_counts_them(tiny_model, prompts, valkey, tmp_path):
    run_dir = tmp_path / "filtered"
    argv = train_argv(tiny_model, prompts, run_dir, valkey.url, "--num-rollout", "2")
    argv[argv.index("--custom-rm-path") + 1] = "tests.train.reference_plugins.even_groups_all_equal"
    argv += ["--reward-key", "acc", "--dynamic-sampling-filter-path",
             "slimeish.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"]  # fmt: skip
    run_train(argv, tmp_path / "filtered.log")
    steps = [r for r in metrics(run_dir) if "train/loss" in r]
    assert len(steps) == 2
    dropped = sum(r.get("rollout/dynamic_filter/drop_zero_std_1.0", 0) for r in steps)
    assert dropped >= 2 and dropped == sum(r["buffer/groups_filtered"] for r in steps)
    assert all(r["rollout/reward_mean"] == 0.5 for r in steps)  # only the odd groups were trained on


def test_a_slime_generate_posting_to_the_root_generate_trains(tiny_model, prompts, valkey, tmp_path):
    """The plugin calls the engine itself: its samples are recorded from what it returns, tool
    result (mask 0) included, and trained on with the exact sampled log-probs."""
    run_dir = tmp_path / "root-generate"
    argv = train_argv(tiny_model, prompts, run_dir, valkey.url, "--num-rollout", "2", "--run-id", "root-generate")
    argv += ["--custom-generate-function-path", "tests.train.slime_style_plugins.generate_with_tool"]
    run_train(argv, tmp_path / "root-generate.log")
    steps = [r for r in metrics(run_dir) if "train/loss" in r]
    assert len(steps) == 2
    assert all(r["train/rollout_logprob_abs_diff_max"] <= 1e-4 for r in steps)
    groups = [g for line in ledger(run_dir) for g in line["groups"]]
    assert len(groups) == len(set(groups)) == 4
    samples = asyncio.run(stored_samples(valkey.url, "root-generate"))
    assert samples and all(0 in s.loss_mask and 1 in s.loss_mask for s in samples)  # tool result kept, masked
    assert all(s.reward is not None and s.weight_versions for s in samples)


async def stored_samples(url: str, run_id: str) -> list[Sample]:
    async with Buffer(url, run_id) as buf:
        return [s async for s in buf.iter_samples()]


def test_a_slime_generate_returning_a_list_trains_each_sample(tiny_model, prompts, valkey, tmp_path):
    """Each returned sample becomes one segment of its member's session, trained with its reward."""
    run_dir = tmp_path / "list-generate"
    argv = train_argv(tiny_model, prompts, run_dir, valkey.url, "--num-rollout", "1", "--run-id", "list-generate")
    argv += ["--custom-generate-function-path", "tests.train.slime_style_plugins.generate_two_samples"]
    run_train(argv, tmp_path / "list-generate.log")
    assert len([r for r in metrics(run_dir) if "train/loss" in r]) == 1
    samples = asyncio.run(stored_samples(valkey.url, "list-generate"))
    assert len(samples) == 2 * 2 * 2  # 2 groups x 2 members x 2 returned samples
    assert sorted(s.segment_index for s in samples) == [0] * 4 + [1] * 4
    assert all(s.reward == float(s.index % 2) for s in samples)


def test_slimes_sft_rollout_trains_samples_without_log_probs(tiny_model, valkey, tmp_path):
    """slime's SFT rollout shape (a bare list of one-sample groups, no rollout log-probs) under
    --loss-type sft_loss: the conversations reach the buffer and train, their loss falling."""
    conversation = [{"role": "user", "content": "say kiwi"}, {"role": "assistant", "content": "kiwi kiwi kiwi"}]
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"messages": conversation}) + "\n")
    run_dir = tmp_path / "sft"
    argv = [sys.executable, "-m", "slimeish", "train", "--hf-checkpoint", str(tiny_model), "--run-dir", str(run_dir),
            "--buffer-url", valkey.url, "--prompt-data", str(data), "--input-key", "messages", "--run-id", "sft",
            "--rollout-function-path", "tests.train.slime_style_plugins.sft_rollout", "--loss-type", "sft_loss",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "1", "--num-rollout", "3",
            "--lr", "1e-3"]  # fmt: skip
    run_train(argv, tmp_path / "sft.log")
    steps = [r for r in metrics(run_dir) if "train/loss" in r]
    assert len(steps) == 3 and steps[-1]["train/loss"] < steps[0]["train/loss"]
    samples = asyncio.run(stored_samples(valkey.url, "sft"))
    assert len(samples) == 6 and all(set(s.loss_mask) == {1} and s.response_length > 3 for s in samples)


def test_on_policy_distillation_with_a_teacher_engine_trains(tiny_model, prompts, valkey, tmp_path):
    """slime's OPD recipe: the reward asks a second engine (the teacher, at --rm-url) for the prompt
    log-probs of each sample, the post-process keeps the response's as teacher_log_probs, and
    --use-opd trains on the reverse KL. Teacher = student here, so the KL is ~0 on the first step."""
    from tests.engine.conftest import start_engine

    teacher, url = start_engine(tiny_model, tmp_path)
    try:
        run_dir = tmp_path / "opd"
        argv = train_argv(tiny_model, prompts, run_dir, valkey.url, "--num-rollout", "2", "--run-id", "opd")
        argv[argv.index("--custom-rm-path") + 1] = "tests.train.slime_style_plugins.teacher_logprob_reward"
        post_process = "tests.train.slime_style_plugins.teacher_logprobs_post_process"
        argv += ["--custom-reward-post-process-path", post_process, "--rm-url", f"{url}/generate",
                 "--use-opd", "--opd-type", "sglang", "--opd-kl-coef", "1.0"]  # fmt: skip
        run_train(argv, tmp_path / "opd.log")
    finally:
        teacher.stop()
    steps = [r for r in metrics(run_dir) if "train/loss" in r]
    assert len(steps) == 2
    assert abs(steps[0]["train/opd_kl"]) <= 1e-4  # the teacher's log-probs are the student's own
    assert all("train/opd_kl" in r for r in steps)
    samples = asyncio.run(stored_samples(valkey.url, "opd"))
    assert samples and all(s.teacher_log_probs is not None for s in samples)


def test_slimes_rollout_side_hooks_in_one_run(tiny_model, prompts, valkey, tmp_path):
    """--custom-config-path's key reaches the --eval-function-path plugin, whose metric is logged; the
    sample filter's removed samples train on no token; the log function sees each step's samples."""
    run_dir = tmp_path / "hooks"
    custom = tmp_path / "custom.yaml"
    custom.write_text("eval_tag: tagged\n")
    plugins = "tests.train.slime_hook_plugins"
    argv = train_argv(tiny_model, prompts, run_dir, valkey.url, "--num-rollout", "2", "--run-id", "hooks",
                      "--eval-interval", "1", "--custom-config-path", str(custom),
                      "--eval-function-path", f"{plugins}.eval_with_tag",
                      "--rollout-sample-filter-path", f"{plugins}.drop_index_one",
                      "--custom-rollout-log-function-path", f"{plugins}.record_rollout")  # fmt: skip
    run_train(argv, tmp_path / "hooks.log")
    rows = metrics(run_dir)
    assert [r["eval/tagged"] for r in rows if "eval/tagged" in r] == [0.0, 1.0, 2.0]  # first, each step, last
    logged = [json.loads(x) for x in (run_dir / "hook_log.jsonl").read_text().splitlines()]
    assert [(x["rollout_id"], x["samples"]) for x in logged] == [(0, 4), (1, 4)]
    assert all(x["removed_tokens"] == [0, 0] for x in logged)  # index 1 of each group trained on nothing
