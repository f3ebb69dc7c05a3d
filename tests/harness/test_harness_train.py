"""`slimeish train` over the example tasks with the tiny model and the embedded engine: harness
episodes captured exactly, each group trained once in sync and in async mode, nothing of the
infrastructure's faults (a program that dies before its first model call, a sandbox removed from
outside while its agent runs, a grader that crashes) stored as a reward; in sync mode each faulty
member regenerated once and trained, and a program past its timeout trained as its own failure."""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from examples.coding_tasks.run import CodingRunConfig, agent_command
from slimeish.buffer import Buffer
from slimeish.common.procs import ManagedProcess
from slimeish.common.sample import Sample
from slimeish.rollout_functions.harness.rollout import LOST, OUTCOME
from slimeish.train.metrics import read_metrics
from tests.harness.conftest import EXAMPLE_TASKS, sandbox_lost_when_marked
from tests.train import conftest as train_fixtures

ROOT = Path(__file__).resolve().parents[2]
OWN_OUTCOMES = ("completed", "agent_timeout", "agent_out_of_memory", "agent_error")
valkey = train_fixtures.valkey  # a fixture: the buffer outlives the run, to be read after it
SLOW_MARK = ".slow-episode"  # left in the workspace by the episode that runs past its timeout
LOST_MARK = ".lose-me"  # left by the episode whose sandbox the test then removes from outside


def fault_agent(flags: Path) -> str:
    """The example agent, except for the first three episodes to start (whichever they are): one
    exits before any model call; one makes a model call, then marks its workspace and waits to be
    lost from outside; one makes a model call, marks its workspace and sleeps past its timeout."""
    python, agent = shlex.quote(sys.executable), EXAMPLE_TASKS.parent / "agent.py"
    one_call = f"{python} {agent} --max-turns 1 --max-tokens 2"
    return (
        f"mkdir {flags}/start 2>/dev/null && exit 3; "
        f"if mkdir {flags}/lost 2>/dev/null; then {one_call}; touch {LOST_MARK}; sleep 600; fi; "
        f"if mkdir {flags}/slow 2>/dev/null; then {one_call}; echo slow > {SLOW_MARK}; sleep 600; fi; "
        f"exec {agent_command(CodingRunConfig())}"
    )


def tasks_whose_first_grader_crashes(tmp_path: Path, flags: Path) -> Path:
    """The example tasks, each test.sh first killing itself by SIGSEGV if it is the first grader to
    run (not the slow episode's, which must be graded to be trained as its own timeout)."""
    tasks = tmp_path / "tasks"
    shutil.copytree(EXAMPLE_TASKS, tasks)
    crash = f'if [ ! -e "$APP_DIR/{SLOW_MARK}" ] && mkdir {flags}/grader 2>/dev/null; then kill -SEGV $$; fi\n'
    for test_sh in tasks.glob("*/tests/test.sh"):
        test_sh.write_text(crash + test_sh.read_text())
    return tasks


def stored_samples(url: str, run_id: str) -> list[Sample]:
    async def read() -> list[Sample]:
        async with Buffer(url, run_id) as buf:
            return [s async for s in buf.iter_samples()]

    return asyncio.run(read())


@pytest.mark.slow  # 3 steps of 4 episodes each, one of them sleeping past its 60 s timeout
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_three_steps_train_each_group_once_and_regenerate_the_infrastructures_faults(
    tiny_model,
    tmp_path,
    valkey,
    mode,
):
    flags = tmp_path / "faults"
    flags.mkdir()
    agent = fault_agent(flags)
    run_dir = tmp_path / f"run-{mode}"
    argv = [sys.executable, "-m", "examples.coding_tasks.run", "--run-dir", str(run_dir), "--num-rollout", "3"]
    argv += ["--model-path", str(tiny_model), "--tasks", str(tasks_whose_first_grader_crashes(tmp_path, flags))]
    argv += ["--agent-command", agent, "--mode", mode, "--buffer-url", valkey.url]
    sandboxes = tmp_path / "sandboxes"
    argv += ["--sandbox-root", str(sandboxes), "--sandbox-bwrap", "off"]  # the fault flags live on the host
    log = tmp_path / "run.log"
    with (
        sandbox_lost_when_marked(sandboxes, LOST_MARK) as removed,
        ManagedProcess(argv, log_path=log, env={"PYTHONPATH": str(ROOT)}) as proc,
    ):
        assert proc.proc.wait(900) == 0, log.read_text()[-3000:]
    assert removed.is_set() and "--agent-command " + shlex.quote(agent) in log.read_text()

    assert sorted(p.name for p in flags.iterdir()) == ["grader", "lost", "slow", "start"]  # every fault happened
    rows = [r for r in read_metrics(run_dir) if "train/loss" in r]
    assert [r["step"] for r in rows] == [0, 1, 2] and all(r["rollout/samples"] == 4 for r in rows)
    groups = [
        g for line in (run_dir / "trained_groups.jsonl").read_text().splitlines() for g in json.loads(line)["groups"]
    ]
    assert len(groups) == len(set(groups)) == 6  # exactly once per group
    samples = stored_samples(valkey.url, run_dir.name)
    # A stored sample's group is the buffer group it was finished in (`metadata["group_id"]`): its
    # `group_index` is the buffer's count of groups opened before it (docs/buffer.md), which in async
    # mode, where groups open concurrently, is not the data source's draw index the group id names.
    trained = [s for s in samples if s.metadata["group_id"] in groups]
    members: dict[tuple[str, int | None], set[str | None]] = {}
    for s in trained:
        members.setdefault((s.metadata["group_id"], s.index), set()).add(s.session_id)
    # every member of every trained group is stored, from one session each (its segments share it)
    assert members.keys() == {(g, i) for g in groups for i in (0, 1)} and all(len(m) == 1 for m in members.values())
    assert all(s.loss_mask is not None and sum(s.loss_mask) >= 1 for s in trained)  # its sampled turns
    # nothing from the infrastructure is stored as a reward: every stored episode is the agent's own
    assert {s.metadata.get(OUTCOME, {}).get("kind") for s in samples} <= set(OWN_OUTCOMES)
    if mode == "sync":
        # every group drawn is trained; an async run stops with its last groups generated but not
        # taken (a faulty member may be among them, its call's episodes/* in no step's line), so
        # the faults are followed in sync mode
        faults_regenerated_once_and_the_timeout_trained(rows, trained)


def faults_regenerated_once_and_the_timeout_trained(rows: list[dict], trained: list[Sample]) -> None:
    assert all(r["train/rollout_logprob_abs_diff_max"] <= 1e-4 for r in rows)  # exactly the sampled tokens
    infrastructure = ("agent_start_failed", "grader_failed", "sandbox_failed")
    # per step: every lost attempt counted by kind, each member regenerated once, none failed
    assert {kind: sum(r[f"episodes/harness_{kind}"] for r in rows) for kind in infrastructure} == dict.fromkeys(
        infrastructure, 1
    )
    assert sum(r["episodes/regenerated"] for r in rows) == 3 and sum(r["episodes/failed"] for r in rows) == 0
    assert sum(r["episodes/harness_agent_timeout"] for r in rows) == 1
    # in the buffer: the trained members that were regenerated, each after its one lost attempt
    lost = sorted((attempt["kind"], attempt["reason"]) for s in trained for attempt in s.metadata[LOST])
    assert [kind for kind, _ in lost] == list(infrastructure)
    assert "was removed while a command ran" in lost[2][1] and "exited with -11" in lost[1][1]  # SIGSEGV
    (slow,) = [s for s in trained if SLOW_MARK in s.metadata[OUTCOME]["patch"]]
    assert slow.metadata[OUTCOME]["kind"] == "agent_timeout"
    assert "killed at the agent timeout" in slow.metadata[OUTCOME]["reason"]
    assert slow.reward == 0.0  # graded as it stood: a workspace with only the mark fails the tests


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
