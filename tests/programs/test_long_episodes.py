"""Claude Code, as installed and in its default configuration, on a task long enough that it
compacts its context and with a sub-agent: one episode, every split classified.

The scripted stand-in engine (tests/scripted_engine.py) plays a model that hands a side task to a
sub-agent through Claude Code's `Agent` tool (in the foreground: the parent waits on the call), then
reads large command outputs until Claude Code's auto-compact summarizes the conversation, then,
from the summary, applies an example task's reference fix and answers. Claude Code compacts when
the input tokens our responses report pass its threshold: `CLAUDE_CODE_AUTO_COMPACT_WINDOW` at
its minimum (100k) less the 20k it keeps for output, less 13k: 67k, which three large outputs pass
(and the conversation after the summary does not, so it compacts once). Its compaction request is
the conversation plus a request for a summary (its summary sampled and trained); the conversation
after it opens with the summary (`compaction`); the sub-agent's opens with the call's prompt
(`sub_agent`). The task's own grader gives the one reward every sample carries."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass

import pytest

from slimeish.router import history as H
from tests.harness.conftest import EXAMPLE_TASKS
from tests.programs.conftest import claude_code, turns_of
from tests.router.test_anthropic_sdk import engine_calls
from tests.scripted_engine import Prompt, shell_arguments, side_reply, tool_call

pytestmark = pytest.mark.slow

TASK = EXAMPLE_TASKS / "fix-add-bug"
SUB_TASK = "Count the lines of calc.py with wc and report the number."
SUMMARY = "SUMMARY: the task is to fix calc.py; the outputs were read; next: run the fix."
BIG = "echo big-output; seq 100000 104000"  # about 4k lines a call
LIMIT = 8  # big outputs before the model gives up: the compaction comes after three


def _bash(prompt: Prompt, command: str) -> str:
    return tool_call("Bash", shell_arguments(prompt.tools["Bash"], command))


@dataclass
class CompactingModel:
    """The scripted model's policy; `fix` is the task's reference solution as a command."""

    fix: str
    instruction: str  # a line of the task's instruction: in the main agent's prompts until compacted

    def reply(self, prompt: Prompt) -> str:
        request = prompt.text.rsplit("<|im_start|>user", 1)[-1]  # the prompt's last user message
        if "Bash" not in prompt.tools:
            return side_reply(prompt)
        if "<analysis>" in request and "<summary>" in request:  # Claude Code asks for its summary
            return f"<analysis>A fix to apply.</analysis>\n<summary>\n{SUMMARY}\n</summary>"
        if SUMMARY in prompt.text:  # compacted: apply the fix once, then answer
            return "Done." if self.fix in prompt.text.split(SUMMARY)[-1] else _bash(prompt, self.fix)
        if self.instruction not in prompt.text:  # the sub-agent
            return "calc.py has a few lines." if prompt.tool_results else _bash(prompt, "wc -l calc.py")
        if SUB_TASK not in prompt.text:
            arguments = {"description": "Count lines", "prompt": SUB_TASK, "run_in_background": False}
            return tool_call("Agent", arguments)
        if prompt.text.count("big-output") < LIMIT:
            return _bash(prompt, BIG)
        return "Gave up: no compaction came."


def grade(work, logs) -> float:
    """The task's own tests on the workspace (Harbor's contract: the reward in reward.txt)."""
    (logs / "verifier").mkdir(parents=True)
    env = {"APP_DIR": str(work), "TESTS_DIR": str(TASK / "tests"), "LOGS_DIR": str(logs), "PATH": "/usr/bin:/bin"}
    subprocess.run(["bash", str(TASK / "tests" / "test.sh")], env=env, check=True, capture_output=True)
    return float((logs / "verifier" / "reward.txt").read_text())


def test_claude_code_compacts_and_runs_a_sub_agent_in_one_episode(scripted, tmp_path):
    harness, engine = scripted
    shutil.copytree(TASK / "environment" / "workspace", tmp_path / "work")
    fix = f"APP_DIR=. bash {TASK / 'solution' / 'solve.sh'}"
    instruction = (TASK / "instruction.md").read_text()
    engine.policy = CompactingModel(fix, instruction.splitlines()[0])
    session, start, seen = harness.start_episode("claude-long")
    invocation = claude_code(session, tmp_path, instruction, "--allowedTools", "Bash,Agent")
    invocation.env.update(CLAUDE_CODE_AUTO_COMPACT_WINDOW="100000")
    r = harness.run(invocation, tmp_path)
    output = (r.stdout + r.stderr)[-3000:] + "\nthe engine's calls:\n" + engine.summary(start)
    assert r.returncode == 0, output

    reward = grade(tmp_path / "work", tmp_path / "logs")
    assert reward == 1.0, output
    samples = harness.check_episode(session, start, seen, reward)  # exact capture, sealed with the grader's reward
    reasons = Counter(s.split_reason for s in samples)
    # Claude Code compacts on the reply whose usage passed the threshold, before running its tool
    # call: its summary request is that reply's prompt plus the request, the call left out
    # (`reply_dropped`, told apart from other dropped replies only by the conversation after it)
    assert reasons == {None: 1, H.SUB_AGENT: 1, H.REPLY_DROPPED: 1, H.COMPACTION: 1}, (reasons, output)
    assert {s.reward for s in samples} == {reward}
    # the summary's turn is sampled, and held by the segment that it summarizes
    calls = engine_calls(engine.calls[start:])
    (summary,) = [i for i, (_, a) in enumerate(calls) if SUMMARY in a["text"]]
    (request,) = [s for s in samples if s.split_reason == H.REPLY_DROPPED]
    assert summary in turns_of(request, calls)
