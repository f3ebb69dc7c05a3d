"""Each agent program, as installed and with its default configuration, given only a session's URL
and key in its own way (docs/agents.md), runs one task non-interactively against the router and a
real engine: every request it sends is answered 2xx, it exits 0, and each turn is stored exactly as
the engine sampled it.

The tiny model writes noise, so here the program gets a text reply and ends its episode there; the
same programs finish a tool-using episode against a scripted engine in test_tool_episodes.py."""

from __future__ import annotations

import itertools

import pytest

from tests.programs.conftest import SHORT, TASK, claude_code, codex, gemini_cli, mini_swe_agent, opencode
from tests.router.test_anthropic_sdk import engine_calls

pytestmark = pytest.mark.slow


def test_codex_exec(harness, tmp_path):
    session, start, seen = harness.start_episode("codex", sampling_defaults=SHORT)
    r = harness.run(codex(session, tmp_path, TASK), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    # Codex tries the Responses WebSocket first; refused, it falls back to HTTP (no HTTP request is refused)
    assert "/responses" in harness.posts(seen)
    harness.check_episode(session, start, seen)


def test_claude_code_print(harness, tmp_path):
    session, start, seen = harness.start_episode("claude", sampling_defaults=SHORT)
    r = harness.run(claude_code(session, tmp_path, TASK), tmp_path)
    posts = harness.posts(seen)
    # a blank reply stopped by a stop sequence is sent once more; blank again, Claude Code ends its
    # run as `error_during_execution` (exit 1, "Execution error"): the program's answer to a model
    # that said nothing (about 1 run in 100 here), not a refused request
    replies = [a["text"] for _, a in engine_calls(harness.router.engine_log[start:])]
    gave_up = replies.count("") >= 2 and r.stdout.strip() == "Execution error"  # a side call may come last
    assert r.returncode == 0 or gave_up, (r.stdout + r.stderr)[-3000:] + f"\nreplies: {replies}"
    assert "/messages" in posts
    harness.check_episode(session, start, seen)


def test_opencode_run(harness, tmp_path):
    session, start, seen = harness.start_episode("opencode", sampling_defaults=SHORT)
    r = harness.run(opencode(session, tmp_path, TASK), tmp_path)
    assert r.returncode == 0 and "Error" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    assert harness.posts(seen).count("/chat/completions") >= 2  # the episode's turn and its title
    samples = harness.check_episode(session, start, seen)
    # the title request (its own system prompt, no tools) is a segment of its own
    assert len(samples) >= 2


def test_mini_swe_agent(harness, tmp_path):
    session, start, seen = harness.start_episode("mini", sampling_defaults=SHORT)
    # the noise the tiny model writes is a format error to it, answered by another turn, with no
    # step limit by default: its default config (mini.yaml) plus a limit of 3 steps
    r = harness.run(mini_swe_agent(session, tmp_path, TASK, "-c", "mini.yaml", "-c", "agent.step_limit=3"), tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert harness.posts(seen) == ["/chat/completions"] * 3
    # each sample exact; each turn after the first is its own segment, `reply_dropped`: a reply with
    # no tool call is a format error to mini-swe-agent, which drops the reply from its history and
    # sends only its error message, so the next prompt never held the sampled reply (a split is right;
    # a tool-call reply comes back as returned: test_tool_episodes.py's episode is one segment)
    samples = harness.check_episode(session, start, seen)
    assert [s.split_reason for s in samples] == [None, "reply_dropped", "reply_dropped"]


def test_gemini_cli(harness, tmp_path):
    session, start, seen = harness.start_episode("gemini", sampling_defaults=SHORT)
    r = harness.run(gemini_cli(session, tmp_path, TASK), tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    # its model router first asks a JSON complexity score (`generateContent`, `responseMimeType` JSON),
    # retried while the reply is no JSON (the tiny model's never is), then falls back to its default
    # model for the episode's streamed turn; that turn is sent again while the reply has no text
    # (Gemini CLI's `InvalidStreamError` retry: the tiny model's reply may be blank)
    posts = harness.posts(seen)
    side = list(itertools.takewhile(lambda p: p.endswith(":generateContent"), posts))
    turns = posts[len(side) :]
    assert side and turns, posts
    assert all(t.startswith("/v1beta/models/") and t.endswith(":streamGenerateContent") for t in turns), posts
    samples = harness.check_episode(session, start, seen)
    # each side call is a segment of its own (the same prompt again: `prompt_repeated`); the turn
    # (its own system prompt and tools) one more; a resent turn is `prompt_repeated`, or, when
    # Gemini CLI appends its retry nudge to the task's (first) user message, `new_conversation`
    reasons = [s.split_reason for s in samples]
    assert reasons[len(side)] == "tools_changed", reasons
    assert set(reasons[1 : len(side)]) <= {"prompt_repeated"}, reasons
    assert set(reasons[len(side) + 1 :]) <= {"prompt_repeated", "new_conversation"}, reasons
