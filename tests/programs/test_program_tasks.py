"""Each agent program (Claude Code, opencode, Codex CLI, mini-swe-agent) solves one example task and fails another
through `slimeish train`: the harness rollout runs the program unmodified as `--agent-command` in
each task's sandbox, against the scripted stand-in engine (tests/scripted_engine.py) as
`--engine-url`, which runs the task's reference fix (`bash solution/solve.sh`) through the
program's own shell tool for one task and a command that changes nothing for the other. One step
of one group per task: the task's own tests give reward 1 and 0, every stored sample holds exactly
the tokens and log-probs the stand-in returned, and each tool call's turn and the turn that read
its result are one segment. The weights go to the stand-in by `--weight-sync disk`."""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from slimeish.common.procs import ManagedProcess
from slimeish.rollout_functions.harness.rollout import OUTCOME
from slimeish.train.metrics import read_metrics
from tests.harness.conftest import EXAMPLE_TASKS
from tests.harness.test_harness_train import stored_samples
from tests.programs.conftest import Invocation, claude_code, codex, mini_swe_agent, opencode, turns_of
from tests.programs.test_tool_episodes import assert_one_segment
from tests.router.test_openai_sdk import assert_exact_capture
from tests.scripted_engine import Policy, Prompt, ScriptedEngine, ShellScript, code_mode_arguments, side_reply
from tests.stand_in import serve_app
from tests.train import conftest as train_fixtures

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SOLVED, FAILED = "fix-add-bug", "fix-median"  # the task the policy fixes, and the one it does not
valkey = train_fixtures.valkey  # a fixture: the buffer outlives the run, to be read after it


@dataclass
class PerTask:
    """The policy for the task whose instruction the prompt holds (each task's first line);
    a prompt holding none is a program's auxiliary call."""

    policies: dict[str, Policy]  # by a line of the task's instruction

    def reply(self, prompt: Prompt) -> str:
        for line, policy in self.policies.items():
            if line in prompt.text:
                return policy.reply(prompt)
        return side_reply(prompt)


def instruction_line(task: Path) -> str:
    return (task / "instruction.md").read_text().splitlines()[0]


def sandbox_command(build: Callable[..., Invocation], root: Path, *flags: str) -> str:
    """The program's command line as the harness runs it in a sandbox: the session's URL, key and
    the task's instruction from the variables the harness sets (docs/harness.md), each argument
    double-quoted so that they expand; `root` holds what the builder writes on the host."""

    def quoted(value: str) -> str:
        return '"' + re.sub(r'(["\\`])', r"\\\1", value) + '"'

    session = {"base_url": "${OPENAI_BASE_URL%/v1}/v1", "api_key": "$OPENAI_API_KEY"}
    invocation = build(session, root, "$SLIMEISH_INSTRUCTION", *flags)
    env = [f"{name}={quoted(value)}" for name, value in invocation.env.items()]
    return " ".join([*env, "exec", *map(quoted, invocation.argv)])


@dataclass(frozen=True)
class Program:
    """A program as `--agent-command`, with its headless approval flags (docs/agents.md), and the
    scripted model's policy for a task given the commands it runs."""

    build: Callable[..., Invocation]
    flags: tuple[str, ...]
    policy: Callable[[list[str]], ShellScript]


SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini-swe-agent ends on this command's output

PROGRAMS = {
    "claude-code": Program(claude_code, ("--allowedTools", "Bash"), lambda run: ShellScript("Bash", run)),
    "opencode": Program(opencode, (), lambda run: ShellScript("bash", run)),
    # its shell is a nested tool of its code-mode `exec` (test_tool_episodes.py); no sandbox of its own
    "codex": Program(
        codex,
        ("--dangerously-bypass-approvals-and-sandbox",),
        lambda run: ShellScript("functions__exec", run, arguments=code_mode_arguments),
    ),
    "mini-swe-agent": Program(mini_swe_agent, (), lambda run: ShellScript("bash", [*run, SUBMIT])),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_solves_one_task_and_fails_another_through_train(name, long_context_model, tmp_path, valkey):
    program = PROGRAMS[name]
    command = sandbox_command(program.build, tmp_path, *program.flags)
    tasks = tmp_path / "tasks"
    for task in (SOLVED, FAILED):
        shutil.copytree(EXAMPLE_TASKS / task, tasks / task)
    fix = f"bash {tasks / SOLVED / 'solution' / 'solve.sh'}"  # the sandboxes run without bubblewrap
    engine = ScriptedEngine(long_context_model)
    engine.policy = PerTask(
        {
            instruction_line(tasks / SOLVED): program.policy([fix]),
            instruction_line(tasks / FAILED): program.policy(["echo no fix"]),
        }
    )
    run_dir = tmp_path / f"run-{name}"  # its id: the buffer is shared by the programs' runs
    argv = [sys.executable, "-m", "examples.coding_tasks.run", "--run-dir", str(run_dir), "--num-rollout", "1"]
    argv += ["--model-path", str(long_context_model), "--tasks", str(tasks), "--buffer-url", valkey.url]
    argv += ["--agent-command", command, "--n-samples-per-prompt", "1", "--sandbox-bwrap", "off"]
    # the programs start slowly on a loaded machine: five times each task's 60 s
    argv += ["--agent-timeout-multiplier", "5", "--rollout-timeout", "420", "--weight-sync", "disk"]
    # a turn's token limit for programs that ask for none (Codex, mini-swe-agent): the default 64 cuts
    # a scripted call short (finish_reason length), which Codex exits 1 on
    argv += ["--rollout-max-response-len", "1024"]
    log = tmp_path / "run.log"
    with (
        serve_app(engine.app(), startup_timeout=30) as url,
        ManagedProcess([*argv, "--engine-url", url], log_path=log, env={"PYTHONPATH": str(ROOT)}) as proc,
    ):
        assert proc.proc.wait(900) == 0, log.read_text()[-3000:] + "\nthe engine's calls:\n" + engine.summary()

    (row,) = [r for r in read_metrics(run_dir) if "train/loss" in r]
    assert row["rollout/samples"] >= 2 and row["episodes/failed"] == 0
    assert engine.weight_version == 1  # the trained weights reached the stand-in
    samples = stored_samples(valkey.url, run_dir.name)
    rewards = {s.metadata[OUTCOME]["task"]: s.reward for s in samples}
    outcomes = [{k: s.metadata[OUTCOME][k] for k in ("task", "kind", "reason", "agent_output")} for s in samples]
    assert rewards == {SOLVED: 1.0, FAILED: 0.0}, outcomes
    calls = engine.calls  # streamed or not, each reply recorded whole
    for sample in samples:
        own = [calls[i] for i in turns_of(sample, calls)]
        assert own, "a stored sample no engine call produced"
        assert_exact_capture(sample, own, None)
    for task in (SOLVED, FAILED):  # each episode's own calls: its last may be the tool call it ends on (mini-swe-agent)
        line = instruction_line(tasks / task)
        own = [c for c in calls if line in engine.tokenizer.decode(c[0]["input_ids"])]
        assert_one_segment([s for s in samples if s.metadata[OUTCOME]["task"] == task], own)
