"""The three plugin hooks load by import path, are checked at start-up, and run as slime's do."""

import asyncio
import os
import sys
from types import SimpleNamespace

import pytest

from slimeish.common.sample import Sample
from slimeish.data import DataSource
from slimeish.rollout import (
    GENERATE_SIGNATURE,
    REWARD_SIGNATURE,
    RolloutConfig,
    RolloutFnTrainOutput,
    load_generate_function,
    load_reward_function,
    load_rollout_function,
    sampling_params,
)

REF = "tests.train.reference_plugins"


def test_reference_rollout_function_runs():
    fn = load_rollout_function(f"{REF}.generate_rollout")
    source = DataSource([Sample(prompt="a", label="a"), Sample(prompt="b", label="c")], 3, shuffle=False)
    out = fn(SimpleNamespace(rollout_batch_size=2), 7, source)
    assert isinstance(out, RolloutFnTrainOutput) and out.metrics == {"rollout_id": 7}
    assert [[s.reward for s in g] for g in out.samples] == [[1.0] * 3, [0.0] * 3]
    assert [[(s.group_index, s.index) for s in g] for g in out.samples] == [
        [(0, i) for i in range(3)],
        [(1, i) for i in range(3)],
    ]


def test_reference_generate_and_reward_run():
    gen = load_generate_function(f"{REF}.generate")
    rm = load_reward_function(f"{REF}.reward")
    params = sampling_params(RolloutConfig(rollout_max_response_len=3))
    sample = asyncio.run(gen(None, Sample(prompt="p", label="xxx"), params))
    assert sample.response == "xxx" and asyncio.run(rm(None, sample)) == 1.0


def test_sync_reward_rejected_with_expected_signature():
    with pytest.raises(ValueError, match="must be an async function") as exc:
        load_reward_function(f"{REF}.not_async_reward")
    assert REWARD_SIGNATURE in str(exc.value)


def test_wrong_arity_rejected_with_expected_signature():
    with pytest.raises(ValueError, match="wrong signature") as exc:
        load_reward_function(f"{REF}.reward_missing_sample")
    assert REWARD_SIGNATURE in str(exc.value)


@pytest.mark.parametrize(
    "path, message",
    [("nomodule_xyz.fn", "cannot import"), (f"{REF}.missing", "has no function"), ("justname", "must be")],
)
def test_bad_paths_name_the_problem(path, message):
    with pytest.raises(ValueError, match=message) as exc:
        load_generate_function(path)
    assert GENERATE_SIGNATURE in str(exc.value) or "cannot import" in str(exc.value)


def test_builtin_rollout_functions_pass_their_own_check():
    for path in (
        "slimeish.rollout_functions.token_in.generate_rollout",
        "slimeish.rollout_functions.agent_command.generate_rollout",
    ):
        assert callable(load_rollout_function(path))
    assert callable(load_generate_function("slimeish.rollout_functions.token_in.generate"))


def test_plugins_import_from_the_working_directory(tmp_path, monkeypatch):
    # The `slimeish` console script does not put the working directory on sys.path; plugins must
    # still import from there, as they do under `python -m slimeish`.
    (tmp_path / "my_rm_plugin_xyz.py").write_text("async def reward(args, sample):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in sys.path if p not in ("", os.getcwd(), str(tmp_path))])
    assert asyncio.run(load_reward_function("my_rm_plugin_xyz.reward")(None, None)) == 1.0
