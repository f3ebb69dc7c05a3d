"""Agent episodes as Ray tasks (`--agent-workers ray`) on a simulated two-node cluster.

The driver opens and finishes sessions on the stand-in router (tests/demo/conftest.py) as it
does locally; the agent command (or the openai agent) runs in a Ray task on the node holding
the `agents` resource. A timeout and a crash fail the episode as locally; a node that dies under
it loses the episode, which is generated again in a new session on a node that is alive.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest

from slimeish.common.sample import Sample
from slimeish.rollout_functions import agent_workers
from slimeish.rollout_functions.agent_command import generate_rollout as command_rollout
from slimeish.rollout_functions.agent_command import run_command
from slimeish.rollout_functions.openai_agent import generate_rollout as agent_rollout
from slimeish.rollout_functions.sessions import REGENERATED
from tests.demo.test_openai_agent import calculator, make_args
from tests.train.test_agent_command import TREE, cancel_once_started, gone

pytestmark = pytest.mark.slow

ON_AGENTS = {"agent_workers": "ray", "agent_num_cpus": 0.5, "agent_resources": {"agents": 1}}
ON_AGENTS |= {"agent_runtime_env": {}, "ray_address": None}
# not make_args' 5 s: on a loaded machine a fresh Ray worker alone can take that long to start the
# episode (stop 33's fresh-clone suite timed out the OpenAI agent's two tasks); the timeout test sets its own
ON_AGENTS |= {"rollout_timeout": 60.0}
ON_AGENTS_CONFIG = {k: ON_AGENTS[k] for k in ("agent_workers", "agent_num_cpus", "agent_resources")}


class _Source:
    def __init__(self, prompt: str, label: object, n: int):
        self.groups = [[Sample(group_index=0, index=i, prompt=prompt, label=label) for i in range(n)]]

    def get_samples(self, n: int) -> list[list[Sample]]:
        return self.groups


def command_args(router, command: str, **overrides):
    return make_args(router, agent_command=command, **(ON_AGENTS | {"verifier_command": None} | overrides))


def run_command_episodes(router, command: str, n: int = 1, **overrides) -> list[Sample]:
    args = command_args(router, command, n_samples_per_prompt=n, rollout_batch_size=1, **overrides)
    return command_rollout(args, 0, _Source("What is 2 plus 2?", 4, n)).samples[0]


def test_command_runs_on_the_agents_node_with_the_session_env(router, ray_cluster):
    command = 'printf "%s|%s|%s\\n" "$OPENAI_BASE_URL" "$SLIMEISH_PROMPT" "$SLIMEISH_LABEL"; echo \'{"reward": 0.5}\''
    samples = run_command_episodes(router, command, n=2)
    finished = {s["finish"]["reward"] for s in router.sessions.values()}
    assert finished == {0.5} and len(router.sessions) == 2
    for sample in samples:
        assert sample.status == Sample.Status.COMPLETED and sample.reward == 0.5
        assert sample.metadata["agent_node_id"] == ray_cluster.agents_node_id
        expected = rf'{router.url}/s/[0-9a-f]{{16}}/v1\|"What is 2 plus 2\?"\|4\n{{"reward": 0.5}}\n'
        assert re.fullmatch(expected, sample.response), sample.response


def test_rollout_concurrency_bounds_the_tasks(router, ray_cluster, tmp_path):
    log = tmp_path / "log"  # the agents node could run 4 at once: the slots allow 1
    command = f"echo start >> {log}; sleep 0.3; echo end >> {log}; echo '{{\"reward\": 1}}'"
    samples = run_command_episodes(router, command, n=3, rollout_concurrency=1)
    assert all(s.status == Sample.Status.COMPLETED for s in samples)
    assert log.read_text().split() == ["start", "end"] * 3


def test_verifier_runs_in_the_task_too(router, ray_cluster):
    (sample,) = run_command_episodes(router, "echo 7", verifier_command='read a; echo "{\\"reward\\": $a}"')
    assert sample.reward == 7.0 and sample.response == "7\n"


def test_crashing_command_fails_the_episode_with_its_stderr(router, ray_cluster):
    (sample,) = run_command_episodes(router, "echo boom >&2; exit 3")
    assert sample.status == Sample.Status.FAILED
    assert sample.metadata["error"].startswith("AgentCommandError: 'echo boom >&2; exit 3' exited with 3: boom")
    ((_, session),) = router.sessions.items()
    assert session["finish"]["status"] == "failed"


def test_timeout_cancels_the_task_and_kills_the_command_tree(router, ray_cluster, tmp_path):
    pid_file = tmp_path / "pid"
    # 30 s: on a loaded machine a fresh Ray worker can take more than 8 s to start the command at
    # all, and a task cancelled before its command ran leaves no child to check (the child would live 10 min)
    (sample,) = run_command_episodes(router, TREE.format(pid_file=pid_file), rollout_timeout=30.0)
    assert sample.status == Sample.Status.FAILED and sample.metadata["error"].startswith("TimeoutError")
    assert pid_file.exists(), "the command never started before the timeout: nothing was checked"
    # within a generous bound, so that a loaded machine does not fail it
    assert gone(int(pid_file.read_text())), "the command's child outlived the cancelled task"


async def _deaf_agent(command: str) -> None:
    """An agent deaf to cancellation (it swallows KeyboardInterrupt and CancelledError, as code
    stuck in a C call would, in effect): its command runs on until the task is force-killed."""
    running = asyncio.ensure_future(run_command(command, {}))
    while True:
        try:
            await asyncio.shield(running)
        except (KeyboardInterrupt, asyncio.CancelledError):
            continue


def test_a_task_deaf_to_cancellation_is_force_killed_and_its_command_tree_goes(ray_cluster, tmp_path, monkeypatch):
    # Ray's force-kill SIGKILLs the worker's direct children (the command's guard shell among them)
    # and then the worker: the guard's watchdog, not the killed shell, takes the group down.
    monkeypatch.setattr(agent_workers, "CANCEL_GRACE_S", 4.0)
    workers = agent_workers.RayWorkers(agent_workers.AgentWorkersConfig(**ON_AGENTS_CONFIG))
    pid_file = tmp_path / "pid"
    child = cancel_once_started(workers.run(_deaf_agent, TREE.format(pid_file=pid_file)), pid_file)
    assert gone(child), "the command's child outlived the force-killed task"


def test_an_episode_whose_node_dies_is_generated_again_on_another_node(router, ray_cluster, tmp_path):
    cluster = ray_cluster.cluster
    doomed = cluster.add_node(num_cpus=1, resources={"doomed": 1})
    cluster.wait_for_nodes()
    pid_file, done = tmp_path / "pid", []
    # The first run notes its pid and waits, to die with its node; the run again answers.
    command = f"if [ -e {pid_file} ]; then echo '{{\"reward\": 1}}'; else echo $$ > {pid_file}; exec sleep 60; fi"
    rollout = threading.Thread(
        target=lambda: done.extend(
            run_command_episodes(router, command, rollout_timeout=50.0, agent_resources={"doomed": 1})
        )
    )
    start = time.monotonic()
    rollout.start()
    while not pid_file.exists():
        time.sleep(0.1)
    cluster.remove_node(doomed)  # a node is added only from the main thread (Ray sets signal handlers)
    replacement = cluster.add_node(num_cpus=1, resources={"doomed": 1})
    try:
        rollout.join(timeout=60)
    finally:
        cluster.remove_node(replacement)
    (sample,) = done
    # Ray's node-death error (or its worker's, when that is seen first) is EpisodeLost: not the
    # agent's failure, so its session is aborted and the episode runs again in a new one.
    assert sample.status == Sample.Status.COMPLETED and sample.reward == 1.0, sample.metadata.get("error")
    assert sample.metadata[REGENERATED] == 1
    assert sample.metadata["agent_node_id"] == replacement.node_id != doomed.node_id
    assert time.monotonic() - start < 50  # lost by the death, not by the timeout
    lost, again = router.sessions.values()
    assert lost["finish"]["status"] == "aborted" and again["finish"]["status"] == "completed"
    assert lost["create"]["index"] == again["create"]["index"] == 0  # the same place of the same group


def test_openai_agent_runs_in_the_task(router, ray_cluster):
    router.reply = calculator
    args = make_args(router, rollout_batch_size=1, n_samples_per_prompt=2, **ON_AGENTS)
    out = agent_rollout(args, 0, _Source("What is 6 times 7?", 42, 2))
    for sample in out.samples[0]:
        assert sample.status == Sample.Status.COMPLETED and sample.reward == 1.0
        assert sample.metadata["agent_node_id"] == ray_cluster.agents_node_id
    assert [s["finish"]["reward"] for s in router.sessions.values()] == [1.0, 1.0]
    assert len(router.requests) == 4  # the tool call and the answer, per episode
