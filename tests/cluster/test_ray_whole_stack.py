"""The whole stack on a simulated 4-node Ray cluster: `slimeish train --launcher ray` with two
engines, two routers and the agent_command example's episodes as Ray tasks on agent workers.

The head runs the trainer (this run's process), node `routers` both routers and the buffer server,
and nodes `a` and `b` one engine each and agent workers (custom resources `engine` and `agents`).
The run trains with exact capture (the trainer's log-probs of the stored tokens equal the
engines'), every step once and no group twice, and where each part ran is read back from Ray's
state API (the parts) and from the raylet each agent command ran under. The same run loses node
`a` mid-run, with no node to replace it, and completes on node `b`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from examples.agent_command.run import AgentRunConfig, commands
from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.common.procs import ManagedProcess
from slimeish.train.metrics import read_metrics
from tests.cluster.conftest import actor_nodes, simulated_cluster
from tests.train.test_faults import check_exactly_once, ledger, wait_for
from tests.train.test_router_replicas import sessions_by_owner
from tests.train.test_train_e2e import group_states

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

ROOT = str(Path(__file__).resolve().parents[2])  # examples/ is imported from the repository root
STEPS = 3


@pytest.fixture
def cluster():
    head = {"num_cpus": 1, "resources": {"trainer": 1}}
    routers = {"num_cpus": 3, "resources": {"router": 3}}  # both routers and the buffer
    engine_and_agents = {"num_cpus": 2, "resources": {"engine": 1, "agents": 2}}  # 1 CPU each role
    with simulated_cluster(head, routers=routers, a=engine_and_agents, b=engine_and_agents) as c:
        yield c


def stack_argv(model: Path, run_dir: Path, address: str, agents: Path, steps: int) -> list[str]:
    """The agent_command example on the cluster; each agent command notes, in `agents/ITS_PID`,
    the raylet it runs under (one per node)."""
    agent = f'echo "$RAY_RAYLET_PID" >> {shlex.quote(str(agents))}/$$; exec {commands(AgentRunConfig())[0]}'
    argv = [sys.executable, "-m", "examples.agent_command.run", "--run-dir", str(run_dir)]
    argv += ["--model-path", str(model), "--num-rollout", str(steps), "--agent-command", agent]
    argv += ["--launcher", "ray", "--ray-address", address, "--num-engines", "2", "--num-routers", "2"]
    argv += ["--engine-resources", '{"engine": 1}', "--router-resources", '{"router": 1}']
    argv += ["--buffer-resources", '{"router": 1}', "--weight-sync", "disk"]
    argv += ["--agent-workers", "ray", "--agent-num-cpus", "0.5", "--agent-resources", '{"agents": 1}']
    return argv


def raylet(cluster, role: str) -> int:
    return cluster.nodes_by_role[role].all_processes["raylet"][0].process.pid


def agent_raylets(agents: Path) -> list[int]:
    """The raylet of every agent command that started, one per command."""
    return [int(line) for f in agents.iterdir() for line in f.read_text().split()]


def running_under(agents: Path, raylet_pid: int) -> bool:
    """An agent command under this raylet is running now."""
    return any(int(f.read_text().split()[-1]) == raylet_pid and _alive(int(f.name)) for f in agents.iterdir())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def steps_done(run_dir: Path) -> int:
    return len(ledger(run_dir)) if (run_dir / "trained_groups.jsonl").exists() else 0


def check_trained_with_exact_capture(run_dir: Path, steps: int) -> list[dict]:
    """Every step once, no group twice, no group lost, each on exactly the sampled tokens; the
    metrics rows of the steps."""
    check_exactly_once(run_dir, steps)
    rows = [r for r in read_metrics(run_dir) if "train/loss" in r]
    assert len(rows) == steps
    for r in rows:
        assert r["train/rollout_logprob_abs_diff_max"] <= 1e-4  # trained on exactly the sampled tokens
    return rows


def test_engines_routers_and_agent_workers_each_on_their_nodes_train_with_exact_capture(tiny_model, tmp_path, cluster):
    run_dir, agents = tmp_path / "stack", tmp_path / "agents"
    agents.mkdir()
    node = {role: n.node_id for role, n in cluster.nodes_by_role.items()}
    log = tmp_path / "run.log"
    argv = stack_argv(tiny_model, run_dir, cluster.address, agents, STEPS)
    with ManagedProcess(argv, log_path=log, env={"PYTHONPATH": ROOT}) as proc:
        wait_for(lambda: steps_done(run_dir) >= 1, "a step", proc)
        placed = actor_nodes(run_dir.name)
        assert {placed.pop("engine0"), placed.pop("engine1")} == {node["a"], node["b"]}  # one engine per node
        assert placed == {"router0": node["routers"], "router1": node["routers"], "buffer": node["routers"]}
        assert proc.proc.wait(600) == 0, log.read_text()[-3000:]

    assert json.loads((run_dir / "parts.json").read_text())["trainer"]["node_id"] == node["head"]
    started = agent_raylets(agents)
    assert len(started) == 4 * STEPS  # 2 groups of 2 a step, each episode once
    assert set(started) <= {raylet(cluster, "a"), raylet(cluster, "b")}  # only where `agents` is
    for r in check_trained_with_exact_capture(run_dir, STEPS):
        assert r["episodes/failed"] == 0
    with EmbeddedServer(run_dir / "buffer") as server:
        completed = sessions_by_owner(server.url, run_dir.name)["completed"]
    assert completed["router0"] > 0 and completed["router1"] > 0, completed  # sessions spread over both routers


def test_a_node_with_an_engine_and_agent_workers_dies_mid_run_and_the_run_completes_without_it(
    tiny_model, tmp_path, cluster
):
    """Node `a` is removed while an agent episode runs on it, and no node replaces it: its engine
    leaves the routers (Ray has nowhere to restart it), the episode is lost to Ray's node death
    (not the agent's failure), its session is aborted and the member generated again in its
    place on node `b`, where every later episode runs, and the run completes every step: every
    group the buffer finished is trained once, none dropped, none lost, none trained twice."""
    steps = STEPS + 1
    run_dir, agents = tmp_path / "nodeloss", tmp_path / "agents"
    agents.mkdir()
    log = tmp_path / "run.log"
    argv = stack_argv(tiny_model, run_dir, cluster.address, agents, steps)
    doomed, survivor = raylet(cluster, "a"), raylet(cluster, "b")
    with ManagedProcess(argv, log_path=log, env={"PYTHONPATH": ROOT}) as proc:
        wait_for(lambda: steps_done(run_dir) >= 1 and running_under(agents, doomed), "an episode on a, mid-run", proc)
        committed_at_removal = steps_done(run_dir)
        cluster.remove_node(cluster.nodes_by_role["a"])
        # after the removal: an episode may start on `a` between the wait above and the removal
        started_before = set(agents.iterdir())
        assert proc.proc.wait(600) == 0, log.read_text()[-3000:]

    assert 0 < committed_at_removal < steps  # removed mid-run
    check_trained_with_exact_capture(run_dir, steps)
    started_after = [int(f.read_text()) for f in set(agents.iterdir()) - started_before]
    assert started_after and set(started_after) == {survivor}  # the episodes went on on node b
    with EmbeddedServer(run_dir / "buffer") as server:
        states = group_states(server.url, run_dir.name)
        statuses = session_statuses(server.url, run_dir.name)
    lost = [(gid, index) for gid, index, status, _ in statuses if status == "aborted"]
    assert lost, "no episode was running on node a when it was removed"
    assert not [s for s in statuses if s[2] == "failed"], statuses  # lost is not failed: no member failed
    # Every group the buffer finished was trained once (check_exactly_once): none dropped, none lost.
    assert {g: s for g, s in states.items() if s not in ("trained", "open")} == {}
    # The lost members were generated again in their places (a new session holds each), and at
    # least one regenerated member completed and was trained with its group.
    assert all(any(s[:2] == place and s[3] for s in statuses) for place in lost), statuses
    regenerated = [(g, i) for g, i in lost if (g, i, "completed", True) in statuses and states[g] == "trained"]
    assert regenerated, (statuses, states)


def session_statuses(url: str, run_id: str) -> list[tuple[str, int, str, bool]]:
    """(group id, index, status, holds its group place) of every session of the run."""

    async def read() -> list[tuple[str, int, str, bool]]:
        async with Buffer(url, run_id) as buf:
            ids = [k.decode().removeprefix(buf.keys.session("")) async for k in buf.redis.scan_iter(
                match=buf.keys.session("*"))]  # fmt: skip
            views = await buf.sessions(ids)
            groups = {
                g.group_id: dict(g.members) for g in await buf.groups(sorted({v.group_id for v in views.values()}))
            }
            return [(v.group_id, v.index, v.status, groups[v.group_id].get(v.index) == sid) for sid, v in views.items()]

    return asyncio.run(read())
