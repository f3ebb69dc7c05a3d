"""The whole stack on a simulated 4-node Ray cluster: `slimeish train --launcher ray` with two
engines, two routers and the agent_command example's episodes as Ray tasks on agent workers.

Each kind of part has a node of its own (custom resources): the head runs the trainer (this run's
process), node `engine` the two engines, node `router` both routers and the buffer server, node
`agents` every agent episode. The run trains with exact capture (the trainer's log-probs of the
stored tokens equal the engines'), every step once and no group twice, and where each part ran is
read back from Ray's state API (the parts) and from the raylet each agent command ran under.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from examples.agent_command.run import AgentRunConfig, commands
from slimeish.buffer import EmbeddedServer
from slimeish.common.procs import ManagedProcess
from slimeish.train.metrics import read_metrics
from tests.cluster.conftest import actor_nodes, simulated_cluster
from tests.train.test_faults import check_exactly_once, ledger, wait_for
from tests.train.test_router_replicas import sessions_by_owner

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

ROOT = str(Path(__file__).resolve().parents[2])  # examples/ is imported from the repository root
STEPS = 3


@pytest.fixture
def cluster():
    head = {"num_cpus": 1, "resources": {"trainer": 1}}
    engine = {"num_cpus": 2, "resources": {"engine": 2}}
    router = {"num_cpus": 3, "resources": {"router": 3}}
    agents = {"num_cpus": 2, "resources": {"agents": 4}}
    with simulated_cluster(head, engine=engine, router=router, agents=agents) as c:
        yield c


def test_engines_routers_and_agent_workers_each_on_their_nodes_train_with_exact_capture(tiny_model, tmp_path, cluster):
    run_dir = tmp_path / "stack"
    raylets = tmp_path / "raylets"  # each agent command notes the raylet it runs under (one per node)
    agent = f'echo "$RAY_RAYLET_PID" >> {shlex.quote(str(raylets))}; exec {commands(AgentRunConfig())[0]}'
    argv = [sys.executable, "-m", "examples.agent_command.run", "--run-dir", str(run_dir)]
    argv += ["--model-path", str(tiny_model), "--num-rollout", str(STEPS), "--agent-command", agent]
    argv += ["--launcher", "ray", "--ray-address", cluster.address, "--num-engines", "2", "--num-routers", "2"]
    argv += ["--engine-resources", '{"engine": 1}', "--router-resources", '{"router": 1}']
    argv += ["--buffer-resources", '{"router": 1}', "--weight-sync", "disk"]
    argv += ["--agent-workers", "ray", "--agent-num-cpus", "0.5", "--agent-resources", '{"agents": 1}']
    node = {role: n.node_id for role, n in cluster.nodes_by_role.items()}
    log = tmp_path / "run.log"
    with ManagedProcess(argv, log_path=log, env={"PYTHONPATH": ROOT}) as proc:
        wait_for(lambda: (run_dir / "trained_groups.jsonl").exists() and len(ledger(run_dir)) >= 1, "a step", proc)
        assert actor_nodes(run_dir.name) == {
            "engine0": node["engine"], "engine1": node["engine"],
            "router0": node["router"], "router1": node["router"], "buffer": node["router"],
        }  # fmt: skip
        assert proc.proc.wait(600) == 0, log.read_text()[-3000:]

    assert json.loads((run_dir / "parts.json").read_text())["trainer"]["node_id"] == node["head"]
    agents_raylet = cluster.nodes_by_role["agents"].all_processes["raylet"][0].process.pid
    assert raylets.read_text().split() == [str(agents_raylet)] * (4 * STEPS)  # 2 groups of 2 a step
    rows = [r for r in read_metrics(run_dir) if "train/loss" in r]
    assert len(rows) == STEPS
    for r in rows:
        assert r["episodes/failed"] == 0
        assert r["train/rollout_logprob_abs_diff_max"] <= 1e-4  # trained on exactly the sampled tokens
    check_exactly_once(run_dir, STEPS)
    with EmbeddedServer(run_dir / "buffer") as server:
        completed = sessions_by_owner(server.url, run_dir.name)["completed"]
    assert completed["router0"] > 0 and completed["router1"] > 0, completed  # sessions spread over both routers
