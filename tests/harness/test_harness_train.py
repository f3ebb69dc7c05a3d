"""`slimeish train` over the example tasks with the tiny model: harness episodes captured exactly, and
an agent program that dies before its first model call regenerated, never trained as a 0."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from examples.coding_tasks.run import CodingRunConfig, agent_command
from slimeish.common.procs import ManagedProcess
from slimeish.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
OWN_OUTCOMES = ("completed", "agent_timeout", "agent_out_of_memory", "agent_error")


@pytest.mark.slow
def test_two_steps_of_harness_episodes_with_two_lost_program_starts(tiny_model, tmp_path):
    flags = tmp_path / "faults"
    flags.mkdir()
    # The first two episodes to start (whichever they are) exit before any model call: infrastructure.
    agent = agent_command(CodingRunConfig())
    faulty = f"mkdir {flags}/1 2>/dev/null && exit 3; mkdir {flags}/2 2>/dev/null && exit 3; exec {agent}"
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "examples.coding_tasks.run", "--run-dir", str(run_dir)]
    argv += ["--model-path", str(tiny_model), "--agent-command", faulty]
    argv += ["--sandbox-bwrap", "off"]  # the fault flags live on the host (isolation: test_sandbox.py)
    log = tmp_path / "run.log"
    with ManagedProcess(argv, log_path=log, env={"PYTHONPATH": str(ROOT)}) as proc:
        assert proc.proc.wait(300) == 0, log.read_text()[-3000:]
    assert "--agent-command " + shlex.quote(faulty) in log.read_text()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert r["rollout/samples"] == 4 and r["episodes/failed"] == 0  # each group trained once, whole
        assert sum(r[f"episodes/harness_{kind}"] for kind in OWN_OUTCOMES) == 4
        assert r["episodes/harness_sandbox_failed"] == r["episodes/harness_grader_failed"] == 0
        assert r["train/rollout_logprob_abs_diff_max"] <= 1e-4  # trained on exactly the sampled tokens
        assert 0.0 <= r["episodes/reward_mean"] <= 1.0
    assert sum(r["episodes/harness_agent_start_failed"] for r in rows) == 2
    assert sum(r["episodes/regenerated"] for r in rows) == 2


@pytest.mark.slow
def test_mini_swe_agent_runs_unmodified_as_the_agent_program(tiny_model, tmp_path):
    """mini-swe-agent (PyPI, the `harness` extra) through `slimeish train`: each episode's model calls
    captured with exact log-probs, the program ending on its own step limit, graded by the task's tests."""
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "examples.coding_tasks.run", "--run-dir", str(run_dir), "--num-rollout", "1"]
    argv += ["--model-path", str(tiny_model), "--agent", "mini-swe-agent"]
    log = tmp_path / "run.log"
    with ManagedProcess(argv, log_path=log, env={"PYTHONPATH": str(ROOT)}) as proc:
        assert proc.proc.wait(600) == 0, log.read_text()[-3000:]
    (row,) = read_metrics(run_dir)
    assert row["rollout/samples"] >= 4 and row["episodes/failed"] == 0
    # the random model never makes a valid tool call: mini-swe-agent re-prompts, stops at its step limit, exits 0
    assert row["episodes/harness_completed"] == 4 and row["episodes/reward_mean"] == 0.0
    assert row["train/rollout_logprob_abs_diff_max"] <= 1e-4
