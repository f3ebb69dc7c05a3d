"""agent_command: reward parsing and the subprocess runner, with real shell commands."""

import asyncio
from types import SimpleNamespace

import pytest

from slimeish.rollout_functions.agent_command import AgentCommandConfig, AgentCommandError, parse_reward, run_command
from slimeish.rollout_functions.agent_workers import workers_of


@pytest.mark.parametrize(
    "stdout, reward",
    [
        ('log\n{"reward": 0.5}\n', 0.5),
        ('{"reward": 1}', 1.0),
        ("no json", None),
        ('{"reward": "1"}', None),
        ('{"reward": true}', None),
        ("", None),
        ("[1]", None),
    ],
)
def test_parse_reward(stdout, reward):
    assert parse_reward(stdout) == reward


def test_command_sees_session_env_and_stdin():
    out = asyncio.run(run_command('echo "$OPENAI_BASE_URL"; cat', {"OPENAI_BASE_URL": "http://x/v1"}, b"in"))
    assert out == "http://x/v1\nin"


def test_crash_is_an_error_with_stderr():
    with pytest.raises(AgentCommandError, match="exited with 3: boom"):
        asyncio.run(run_command("echo boom >&2; exit 3", {}))


def test_timeout_kills_the_command():
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(run_command("sleep 30", {}), 0.5))


@pytest.mark.parametrize(
    "flags, error",
    [({"agent_resources": {"agents": "x"}}, "--agent-resources: 'agents' must be a number >= 0, got 'x'"),
     ({"agent_resources": ["agents"]}, r"--agent-resources must be a JSON object, got \['agents'\]"),
     ({"agent_num_cpus": -1.0}, "--agent-num-cpus must be >= 0")],
)  # fmt: skip
def test_agent_worker_flags_are_checked_at_start_up(flags, error):
    with pytest.raises(ValueError, match=error):
        AgentCommandConfig(agent_command="true", agent_workers="ray", **flags).check()


def test_local_agent_workers_need_no_ray():
    assert workers_of(SimpleNamespace(agent_workers="local")) is None
