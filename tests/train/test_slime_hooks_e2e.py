"""slime's hooks through `slimeish train`: a dict reward resolved by --reward-key, and slime's
zero-variance dynamic filter dropping groups, counted in metrics.jsonl."""

import pytest

from tests.train.test_train_e2e import metrics, prompts, run_train, train_argv, valkey  # noqa: F401

pytestmark = pytest.mark.slow


def test_dynamic_filter_drops_zero_variance_groups_and_counts_them(tiny_model, prompts, valkey, tmp_path):  # noqa: F811
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
