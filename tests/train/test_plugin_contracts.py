"""The three plugin hooks load by import path, are checked at start-up, and run as slime's do;
a rollout function may declare flags of its own."""

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
from slimeish.rollout_functions.openai_agent import AGENT_SIGNATURE
from slimeish.train.setup import check_plugins, command_line, parse_args, plugin_args
from tests.train.reference_flag_plugin import EchoConfig

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


FLAG_PLUGIN = "tests.train.reference_flag_plugin.generate_rollout"
REQUIRED = ["--prompt-data", "p.jsonl", "--model-path", "m"]


def test_a_rollout_function_declares_its_own_flags():
    setup = parse_args(["--rollout-function-path", FLAG_PLUGIN, "--echo-prefix", "hi", *REQUIRED])
    assert setup.plugin == EchoConfig(echo_prefix="hi")
    check_plugins(setup)
    args = plugin_args(setup, "http://127.0.0.1:1", "token")
    assert args.echo_prefix == "hi" and args.rollout_batch_size == setup.rollout.rollout_batch_size
    source = DataSource([Sample(prompt="a")], 2, shuffle=False)
    out = load_rollout_function(FLAG_PLUGIN)(SimpleNamespace(**vars(args) | {"rollout_batch_size": 1}), 0, source)
    assert [s.response for s in out.samples[0]] == ["hi a", "hi a"]
    assert parse_args(command_line(setup)) == setup


def test_plugin_flags_come_from_yaml_and_show_under_the_plugin(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(f"rollout-function-path: {FLAG_PLUGIN}\necho-prefix: from-yaml\n")
    assert parse_args(["--config", str(config), *REQUIRED]).plugin == EchoConfig(echo_prefix="from-yaml")
    with pytest.raises(SystemExit):
        parse_args(["--rollout-function-path", FLAG_PLUGIN, "--help"])
    help_text = capsys.readouterr().out
    assert "tests.train.reference_flag_plugin (rollout function options):\n  --echo-prefix" in help_text


def test_plugin_flags_exist_only_for_their_plugin():
    with pytest.raises(SystemExit):
        parse_args(["--echo-prefix", "hi", *REQUIRED])  # the default rollout function declares none
    assert parse_args(REQUIRED).plugin is None


def test_plugin_check_runs_at_start_up():
    setup = parse_args(["--rollout-function-path", FLAG_PLUGIN, "--echo-prefix", "", *REQUIRED])
    with pytest.raises(ValueError, match="--echo-prefix must not be empty"):
        check_plugins(setup)


def test_wrong_agent_function_fails_at_start_up_with_the_expected_signature():
    rollout = "slimeish.rollout_functions.openai_agent.generate_rollout"
    setup = parse_args(
        ["--rollout-function-path", rollout, "--agent-function-path", f"{REF}.reward_missing_sample", *REQUIRED]
    )
    with pytest.raises(ValueError, match="wrong signature") as exc:
        check_plugins(setup)
    assert AGENT_SIGNATURE in str(exc.value)
