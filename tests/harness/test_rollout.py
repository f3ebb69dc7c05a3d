"""The harness rollout function's own parts: its flags, an episode's spec, and the per-step outcome counts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slimeish.common.sample import Sample
from slimeish.rollout_functions.harness.rollout import LOST, OUTCOME, HarnessConfig, episode_spec, outcome_metrics
from slimeish.rollout_functions.sessions import Session
from tests.harness.conftest import EXAMPLE_TASKS

SESSION = Session(session_id="s1", api_key="sk-1", base_url="http://r/s/sk-1/v1", router_url="http://r")


def test_the_spec_gives_the_program_its_session_and_a_scaled_capped_timeout():
    args = SimpleNamespace(agent_command="my-agent", grade_in_place=False, agent_timeout_multiplier=2.5)
    task_dir = str(EXAMPLE_TASKS / "fix-add-bug")  # [agent] timeout_sec = 60
    spec = episode_spec(SimpleNamespace(**vars(args), rollout_timeout=1000.0), Sample(label=task_dir), SESSION)
    assert spec.timeout_s == 150.0 and spec.agent_command == "my-agent"
    assert spec.env["OPENAI_BASE_URL"] == SESSION.base_url and spec.env["OPENAI_API_KEY"] == "sk-1"
    assert spec.env["SLIMEISH_INSTRUCTION"] == spec.task.instruction
    assert spec.router == ("r", 80)  # what the sandbox lets the agent reach with its network off
    capped = episode_spec(SimpleNamespace(**vars(args), rollout_timeout=100.0), Sample(label=task_dir), SESSION)
    assert capped.timeout_s == 100.0
    with pytest.raises(ValueError, match="label must be its task directory"):
        episode_spec(SimpleNamespace(**vars(args), rollout_timeout=1.0), Sample(label=None), SESSION)


@pytest.mark.parametrize(
    "cfg, error",
    [
        (HarnessConfig(), "needs --agent-command"),
        (HarnessConfig(agent_command="a", agent_timeout_multiplier=0), "> 0"),
        (HarnessConfig(agent_command="a", sandbox_pool=-1), "--sandbox-pool must be >= 0"),
    ],
)
def test_bad_flags_are_refused_at_start_up(cfg, error):
    with pytest.raises(ValueError, match=error):
        cfg.check()


def test_outcomes_are_counted_per_kind_with_every_lost_attempt():
    lost = Sample(
        metadata={LOST: [{"kind": "sandbox_failed"}, {"kind": "grader_failed"}], OUTCOME: {"kind": "completed"}}
    )
    timed_out = Sample(metadata={OUTCOME: {"kind": "agent_timeout"}})
    counts = outcome_metrics([[lost, timed_out], [Sample(metadata={OUTCOME: {"kind": "completed"}})]])
    assert counts == {
        "harness_completed": 2.0,
        "harness_agent_timeout": 1.0,
        "harness_agent_out_of_memory": 0.0,
        "harness_agent_error": 0.0,
        "harness_sandbox_failed": 1.0,
        "harness_agent_start_failed": 0.0,
        "harness_grader_failed": 1.0,
    }
