"""Each agent program, as installed and with its default configuration, finishes a tool-using episode
against the router: the scripted engine (tests/scripted_engine.py) stands in for a model that calls
the program's own shell tool to create hello.txt holding `hi`, then answers. Per program: it exits 0,
the file is there, every request it sends is answered 2xx, the tool call's turn and its continuation
are one stored segment, and every sample holds exactly the engine's tokens and log-probs.

Besides the session's URL and key, each program gets only the flag its headless mode documents for
running a tool without an interactive approval (docs/agents.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from slimeish.router.tool_parser import TOOL_CALL_OPEN
from tests.programs.conftest import (
    TASK,
    Harness,
    Invocation,
    claude_code,
    codex,
    gemini_cli,
    mini_swe_agent,
    opencode,
    turns_of,
)
from tests.router.test_anthropic_sdk import engine_calls
from tests.scripted_engine import ScriptedEngine, ShellScript, code_mode_arguments

pytestmark = pytest.mark.slow

WRITE = "echo hi > hello.txt"


def run_episode(
    scripted: tuple[Harness, ScriptedEngine],
    name: str,
    policy: ShellScript,
    build: Callable[..., Invocation],
    tmp_path: Path,
    *flags: str,
) -> tuple[list, list[str]]:
    """Run the program `build` makes with `flags` under `policy`; check its episode. Returns the
    stored samples and the paths the program POSTed to."""
    harness, engine = scripted
    engine.policy = policy
    session, start, seen = harness.start_episode(name)
    r = harness.run(build(session, tmp_path, TASK, *flags), tmp_path)
    output = (r.stdout + r.stderr)[-3000:] + "\nthe engine's calls:\n" + engine.summary(start)
    assert r.returncode == 0, output
    written = tmp_path / "work" / "hello.txt"
    assert written.exists() and written.read_text().strip() == "hi", output
    posts = harness.posts(seen)
    samples = harness.check_episode(session, start, seen)
    calls = engine_calls(engine.calls[start:])
    assert_one_segment(samples, calls)
    return samples, posts


def assert_one_segment(samples: list, calls: list[tuple[dict, dict]]) -> None:
    """Each turn that called the tool and the turn that read its result are held by one sample (the
    episode's last call may be a tool call its program ends on: mini-swe-agent's submit command)."""
    called = [i for i, (_, reply) in enumerate(calls[:-1]) if TOOL_CALL_OPEN in reply["text"]]
    assert called, "the program never asked the engine for the scripted tool call"
    for i in called:
        q, a = calls[i]
        sampled = q["input_ids"] + a["output_ids"]
        after = [j for j, (r, _) in enumerate(calls) if j > i and r["input_ids"][: len(sampled)] == sampled]
        assert after, f"no turn continues the tool call of engine call {i}"
        assert any({i, after[0]} <= set(turns_of(s, calls)) for s in samples), [s.split_reason for s in samples]


def test_codex_exec(scripted, tmp_path):
    # Codex's default tools for its default model: "code mode", one freeform `exec` tool (in the
    # `functions` namespace, flattened) running JavaScript that calls the nested tools it declares
    policy = ShellScript("functions__exec", [WRITE], arguments=code_mode_arguments)
    # its Linux sandbox cannot start here (`bwrap: execvp codex-linux-sandbox: No such file or
    # directory` as the command's output): the documented flag for an externally sandboxed machine
    run_episode(scripted, "codex", policy, codex, tmp_path, "--dangerously-bypass-approvals-and-sandbox")


def test_claude_code(scripted, tmp_path):
    run_episode(scripted, "claude", ShellScript("Bash", [WRITE]), claude_code, tmp_path, "--allowedTools", "Bash")


def test_opencode(scripted, tmp_path):
    samples, _ = run_episode(scripted, "opencode", ShellScript("bash", [WRITE]), opencode, tmp_path)
    # its title request (its own system prompt, no tools) is a segment of its own
    assert len(samples) == 2, [s.split_reason for s in samples]


def test_mini_swe_agent(scripted, tmp_path):
    # it ends its episode on the output of its own submit command, not on a text answer
    policy = ShellScript("bash", [WRITE, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"])
    samples, _ = run_episode(scripted, "mini", policy, mini_swe_agent, tmp_path)
    assert [s.split_reason for s in samples] == [None]  # both tool calls and their results: one segment


def test_gemini_cli(scripted, tmp_path):
    policy = ShellScript("run_shell_command", [WRITE])
    _, posts = run_episode(scripted, "gemini", policy, gemini_cli, tmp_path, "--approval-mode", "yolo")
    # its complexity classifier (`generateContent`, no tools) took the JSON answer at once (it retries
    # while the answer is no JSON); the episode's turns are streamed
    assert posts[0].endswith(":generateContent") and all(p.endswith(":streamGenerateContent") for p in posts[1:]), posts
