"""`slimeish train --agent-workers ray`: the agent_command example trains 2 steps on the tiny model
while its episodes run as Ray tasks on the simulated cluster's `agents` node."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from examples.agent_command.run import AgentRunConfig, commands
from slimeish.common.procs import ManagedProcess
from slimeish.train.metrics import read_metrics

ROOT = str(Path(__file__).resolve().parents[2])  # examples/ is imported from the repository root


@pytest.mark.slow
def test_train_runs_its_agent_episodes_on_the_agents_node(tiny_model, tmp_path, ray_cluster):
    # The command notes the raylet it runs under (Ray sets RAY_RAYLET_PID in its workers): one per node.
    raylets = tmp_path / "raylets"
    agent = f'echo "$RAY_RAYLET_PID" >> {shlex.quote(str(raylets))}; exec {commands(AgentRunConfig())[0]}'
    argv = [sys.executable, "-m", "examples.agent_command.run", "--run-dir", str(tmp_path / "run")]
    argv += ["--model-path", str(tiny_model), "--num-rollout", "2", "--agent-command", agent]
    argv += ["--agent-workers", "ray", "--ray-address", ray_cluster.cluster.address, "--agent-num-cpus", "0.5"]
    argv += ["--agent-resources", json.dumps({"agents": 1})]
    log = tmp_path / "run.log"
    with ManagedProcess(argv, log_path=log, env={"PYTHONPATH": ROOT}) as proc:
        assert proc.proc.wait(300) == 0, log.read_text()[-3000:]
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert r["episodes/episodes"] == 4 and r["episodes/failed"] == 0
        assert r["train/rollout_logprob_abs_diff_max"] <= 1e-4  # trained on exactly the sampled tokens
    assert rows[-1]["train/weight_version"] == 2
    agents_raylet = ray_cluster.agents_node.all_processes["raylet"][0].process.pid
    assert raylets.read_text().split() == [str(agents_raylet)] * 8
