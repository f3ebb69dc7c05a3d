"""Harness episodes through `run_groups` against a real router, engine and buffer: the agent's turn
captured, the tests' reward and the episode's record stored with the member's samples, and a
program that dies before its first model call regenerated in a new session, never trained."""

from __future__ import annotations

import asyncio
import shlex
import sys
from types import SimpleNamespace

import pytest

from slimeish.common.sample import Sample
from slimeish.rollout_functions.harness.rollout import LOST, OUTCOME, HarnessConfig, harness_episode
from slimeish.rollout_functions.sessions import REGENERATED, Session, run_groups
from tests.harness.conftest import EXAMPLE_TASKS, needs_bwrap, needs_docker
from tests.train import test_episode_lost as routed
from tests.train.test_episode_lost import Stack

# the real router, engine and buffer of tests/train/test_episode_lost.py, as this module's fixtures
engine_url, valkey, stack = routed.engine_url, routed.valkey, routed.stack

Status = Sample.Status
AGENT = EXAMPLE_TASKS.parent / "agent.py"
TASK = EXAMPLE_TASKS / "fix-add-bug"


def harness_args(stack: Stack, tmp_path, agent_command: str) -> SimpleNamespace:
    plugin = HarnessConfig(agent_command=agent_command, sandbox_root=tmp_path / "sandboxes", sandbox_bwrap="off")
    return SimpleNamespace(**vars(stack.args()), **vars(plugin))


@pytest.mark.slow  # an engine start and four sandboxed episodes: minutes on a loaded 2-core machine
async def test_a_solved_task_is_stored_with_its_record_and_a_lost_start_is_regenerated(stack, tmp_path):
    flag = tmp_path / "lost-once"
    # one model call through the session (the real agent), then the reference solution; the very
    # first episode to start exits before any model call (the flag lives on the host: bwrap off)
    agent = f"{shlex.quote(sys.executable)} {AGENT} --max-turns 1 --max-tokens 2"
    command = f"mkdir {flag} 2>/dev/null && exit 3; {agent} && bash {TASK}/solution/solve.sh"
    args = harness_args(stack, tmp_path, command)
    groups = [[Sample(group_index=0, index=i, prompt="fix it", label=str(TASK)) for i in range(2)]]

    async def episode(session: Session, sample: Sample) -> Sample:
        return await harness_episode(args, session, sample)

    (members,) = await asyncio.to_thread(
        lambda: asyncio.run(run_groups(args, groups, episode, rollout_id=0, evaluation=False))
    )
    assert [(s.status, s.reward) for s in members] == [(Status.COMPLETED, 1.0)] * 2
    (regenerated,) = [s for s in members if s.metadata.get(REGENERATED)]
    assert [lost["kind"] for lost in regenerated.metadata[LOST]] == ["agent_start_failed"]
    async with stack.buffer() as buf:
        (group,) = (await buf.take_groups(1, "t", current_version=0)).groups
    assert sorted(s.reward for s in group.samples) == [1.0, 1.0]
    for stored in group.samples:
        record = stored.metadata[OUTCOME]
        assert record["kind"] == "completed" and record["task"] == "fix-add-bug" and record["grader_exit"] == 0
        assert "+    return a + b" in record["patch"]
        assert stored.loss_mask is not None and sum(stored.loss_mask) >= 1  # the agent's sampled turn, trained
    lost_member = next(s for s in group.samples if s.session_id == regenerated.session_id)
    assert [lost["kind"] for lost in lost_member.metadata[LOST]] == ["agent_start_failed"]


@pytest.mark.slow  # an engine start and four sandboxed episodes
@pytest.mark.parametrize("kind", [pytest.param("on", marks=needs_bwrap), pytest.param("docker", marks=needs_docker)])
async def test_an_agent_without_a_network_reaches_its_session_through_the_bridge(stack, tmp_path, kind, request):
    # bubblewrap or a container, and the task's network off (the default): the agent's own network
    # holds only loopback, and the router at the session's URL is reached through the sandbox's
    # bridge. The agent solves fix-add-bug (reward 1) and leaves edit-config as it was (reward 0).
    agent = f"{shlex.quote(sys.executable)} {AGENT} --max-turns 1 --max-tokens 2"
    probe = "python3 -c \"import urllib.request; urllib.request.urlopen('http://10.255.255.1', timeout=5)\""
    solve = f"if [ -e calc.py ]; then bash {TASK}/solution/solve.sh; fi"
    command = f"{probe} 2>&1 | grep -q unreachable && {agent} && {solve}"
    args = harness_args(stack, tmp_path, command)
    args.sandbox_bwrap = "on"
    if kind == "docker":
        args.sandbox_provider = "docker"
        request.getfixturevalue("monkeypatch").setenv("DOCKER_HOST", request.getfixturevalue("docker_daemon"))
    tasks = [TASK, EXAMPLE_TASKS / "edit-config"]
    groups = [
        [Sample(group_index=g, index=i, prompt="do it", label=str(task)) for i in range(2)]
        for g, task in enumerate(tasks)
    ]

    async def episode(session: Session, sample: Sample) -> Sample:
        return await harness_episode(args, session, sample)

    solved, untouched = await asyncio.to_thread(
        lambda: asyncio.run(run_groups(args, groups, episode, rollout_id=0, evaluation=False))
    )
    for members, reward in ((solved, 1.0), (untouched, 0.0)):
        for member in members:
            assert (member.status, member.reward, member.metadata[OUTCOME]["kind"]) == (
                Status.COMPLETED,
                reward,
                "completed",
            )
            assert REGENERATED not in member.metadata  # its model call went through on the first try
    async with stack.buffer() as buf:
        taken = (await buf.take_groups(2, "t", current_version=0)).groups
    assert len(taken) == 2
    for stored in (s for group in taken for s in group.samples):
        assert stored.loss_mask is not None and sum(stored.loss_mask) >= 1  # the sampled turn, captured exactly
