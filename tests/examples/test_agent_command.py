"""examples/agent_command: the agent script and verifier as processes, and one real short run.

The agent and verifier run exactly as `slimeish.rollout_functions.agent_command` runs them (shell command,
environment, stdin), first against the stand-in server (conftest), then, in the slow test, inside
`python -m examples.agent_command.run` against a real router and engine with a tiny model.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from pathlib import Path

import pytest

from examples.agent_command.agent import FOLLOW_UP, last_number, score
from examples.agent_command.run import AgentRunConfig, commands
from slimeish.common.procs import ManagedProcess
from slimeish.rollout_functions.agent_command import parse_reward, run_command
from slimeish.train.metrics import read_metrics

PROMPT = [{"role": "user", "content": "What is 7 plus 5?"}]


def episode_env(server, label) -> dict[str, str]:
    """What the rollout function sets for one episode (the key is the session's secret)."""
    return {
        "OPENAI_BASE_URL": f"{server.url}/v1",
        "OPENAI_API_KEY": "sk-session",
        "SLIMEISH_PROMPT": json.dumps(PROMPT),
        "SLIMEISH_LABEL": json.dumps(label),
    }


@pytest.mark.parametrize(
    "answer, label, reward",
    [("12", 12, 1.0), ("It is 12.", 12, 1.0), ("1,200", 1200, 1.0), ("13", 12, 0.1), ("-4", -4, 1.0), ("", 12, 0.0)],
)
def test_score(answer, label, reward):
    assert score(answer, label) == reward


def test_last_number():
    assert last_number("7 + 5 = 12") == 12.0 and last_number("12-5") == 5.0 and last_number(None) is None


def test_agent_holds_a_two_turn_conversation_and_prints_its_reward(server):
    server.replies[:] = ["7 plus 5 makes 12.", "12"]
    agent, verifier = commands(AgentRunConfig(max_tokens=7))
    assert verifier is None
    stdout = asyncio.run(run_command(agent, episode_env(server, 12)))
    assert parse_reward(stdout) == 1.0
    first, second = (r["body"] for r in server.requests)
    assert all(r["auth"] == "Bearer sk-session" for r in server.requests)
    assert first["messages"] == PROMPT and first["max_tokens"] == 7 and first["temperature"] == 1.0
    # The second turn extends the first exactly, so the router keeps the episode in one segment.
    assert second["messages"] == [
        *PROMPT,
        {"role": "assistant", "content": "7 plus 5 makes 12."},
        {"role": "user", "content": FOLLOW_UP},
    ]


def test_answer_only_agent_is_scored_by_the_verifier(server):
    agent, verifier = commands(AgentRunConfig(verifier=True))
    for label, expected in [(12, 1.0), (11, 0.1)]:
        server.replies[:] = ["working...", "The final number is 12"]
        env = episode_env(server, label)
        stdout = asyncio.run(run_command(agent, env))
        assert parse_reward(stdout) is None, "with --answer-only the agent must leave scoring to the verifier"
        assert json.loads(stdout.splitlines()[-1]) == {"answer": "The final number is 12"}
        assert parse_reward(asyncio.run(run_command(verifier, env, stdin=stdout.encode()))) == expected


@pytest.mark.slow
def test_the_one_command_trains_two_steps(tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "examples.agent_command.run", "--run-dir", str(run_dir)]
    argv += ["--model-path", str(tiny_model), "--num-rollout", "2"]
    log = tmp_path / "run.log"
    root = str(Path(__file__).resolve().parents[2])  # examples/ is imported from the repository root
    with ManagedProcess(argv, log_path=log, env={"PYTHONPATH": root}) as proc:
        assert proc.proc.wait(180) == 0, log.read_text()[-3000:]
    assert "--agent-command " + shlex.quote(commands(AgentRunConfig())[0]) in log.read_text()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert r["episodes/episodes"] == 4 and r["episodes/failed"] == 0
        assert r["rollout/samples"] == 4 and r["rollout/segments_split"] == 0  # two turns, one segment each
        assert r["train/rollout_logprob_abs_diff_max"] <= 1e-4  # trained on exactly the sampled tokens
        assert 0.0 <= r["rollout/reward_mean"] <= 1.0
    assert rows[-1]["train/weight_version"] == 2
