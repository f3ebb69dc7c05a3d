"""`slimeish train --launcher ray` on a multi-node Ray cluster simulated on this machine.

Three nodes with distinct custom resources: the head (the trainer: the run's own process), node A
(`engine`: the engines) and node B (`router`: two routers and the buffer server). The run trains
with exact capture, each part runs where its resources say (Ray's state API), and when node A is
removed mid-run its engines come back on the replacement node: the run completes with every step
trained once, no group lost and none trained twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slimeish.common.procs import ManagedProcess
from tests.cluster.conftest import actor_nodes, list_actors, simulated_cluster
from tests.train.test_faults import STEPS, check_exactly_once, fault_argv, wait_for
from tests.train.test_train_e2e import ledger

ray = pytest.importorskip("ray")  # the test extra installs it; `pip install slimeish` alone does not
pytestmark = pytest.mark.slow


@pytest.fixture
def cluster():
    head = {"num_cpus": 1, "resources": {"trainer": 1}}
    engine = {"num_cpus": 2, "resources": {"engine": 2}}
    router = {"num_cpus": 3, "resources": {"router": 3}}  # two routers and the buffer
    with simulated_cluster(head, engine=engine, router=router) as c:
        yield c


def test_a_ray_run_places_each_part_by_its_resources_and_survives_a_node_removed_mid_run(
    tiny_model, prompts, tmp_path, cluster
):
    run_dir = tmp_path / "rayrun"
    argv = fault_argv(
        tiny_model, prompts, run_dir, "--launcher", "ray", "--ray-address", cluster.address, "--num-engines", "2",
        "--num-routers", "2", "--engine-resources", '{"engine": 1}', "--router-resources", '{"router": 1}',
        "--buffer-resources", '{"router": 1}',
    )  # fmt: skip
    node = {role: n.node_id for role, n in cluster.nodes_by_role.items()}
    with ManagedProcess(argv, log_path=tmp_path / "train.log") as proc:
        wait_for(lambda: (run_dir / "trained_groups.jsonl").exists() and len(ledger(run_dir)) >= 2, "2 steps", proc)
        placed = actor_nodes(run_dir.name)
        assert placed == {"engine0": node["engine"], "engine1": node["engine"], "router0": node["router"],
                          "router1": node["router"], "buffer": node["router"]}  # fmt: skip
        parts = json.loads((run_dir / "parts.json").read_text())
        assert parts["trainer"]["node_id"] == node["head"]
        assert parts["router0"]["url"].split(":")[1] != "//127.0.0.1"  # reachable from other nodes

        committed_at_removal = len(ledger(run_dir))
        cluster.remove_node(cluster.nodes_by_role["engine"])  # node A dies with both engines
        replacement = cluster.add_node(num_cpus=2, resources={"engine": 2})  # as an autoscaler would
        wait_for(lambda: moved(run_dir) == 2, "both engines on the new node", proc)
        assert proc.proc.wait(600) == 0, (tmp_path / "train.log").read_text()[-3000:]
    placed_after = json.loads((run_dir / "parts.json").read_text())
    assert placed_after["engine0"]["node_id"] == placed_after["engine1"]["node_id"] == replacement.node_id
    assert 0 < committed_at_removal < STEPS  # removed mid-run
    check_exactly_once(run_dir)


def moved(run_dir: Path) -> int:
    parts = json.loads((run_dir / "parts.json").read_text())
    return sum(p.get("moves", 0) for p in parts.values())


def test_a_router_whose_node_died_stops_the_run_and_the_same_command_resumes_it(tiny_model, prompts, tmp_path, cluster):
    """A router is not moved (its clients hold its URL): the run stops naming it, and the same
    command, once a node for routers is back, resumes with no group lost or trained twice."""
    run_dir = tmp_path / "routerdeath"
    argv = fault_argv(
        tiny_model, prompts, run_dir, "--launcher", "ray", "--ray-address", cluster.address,
        "--engine-resources", '{"engine": 1}', "--router-resources", '{"router": 1}',
        "--buffer-resources", '{"trainer": 1}',
    )  # fmt: skip
    log = tmp_path / "train.log"
    with ManagedProcess(argv, log_path=log) as proc:
        wait_for(lambda: (run_dir / "trained_groups.jsonl").exists() and len(ledger(run_dir)) >= 4, "4 steps", proc)
        cluster.remove_node(cluster.nodes_by_role["router"])
        assert proc.proc.wait(300) != 0
    assert "router0's actor died and is not restarted" in log.read_text()
    assert "run the same command again to resume" in log.read_text()
    assert len(ledger(run_dir)) < STEPS

    cluster.add_node(num_cpus=3, resources={"router": 3})
    with ManagedProcess(argv, log_path=tmp_path / "resumed.log") as proc:
        assert proc.proc.wait(600) == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    check_exactly_once(run_dir)


def test_a_part_no_node_can_hold_fails_the_start_naming_its_resources(tiny_model, tmp_path, cluster):
    from slimeish.cluster import ClusterConfig
    from slimeish.cluster.launch import RayStack
    from slimeish.train.launch import StackConfig

    cfg = StackConfig(buffer_url="redis://127.0.0.1:1/0", num_engines=1, startup_timeout=10)
    nowhere = ClusterConfig(launcher="ray", engine_resources={"gpu_node": 1})
    stack = RayStack(cfg, nowhere, model_path=tiny_model, run_dir=tmp_path, run_id="nowhere", weight_sync="disk")
    with pytest.raises(TimeoutError, match=r"engines did not start .* 1 CPU, 0 GPU and \{'gpu_node': 1\}"), stack:
        pass
    assert ray.is_initialized()  # the test's own connection is kept
    left = [a.name for a in list_actors(filters=[("state", "!=", "DEAD")]) if (a.name or "").startswith("nowhere/")]
    assert not left, "the engine's actor, still waiting for a node, was not removed"
