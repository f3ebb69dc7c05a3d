"""Each agent program, as installed and with its default configuration, given only a session's URL
and key in its own way (docs/agents.md), runs one task non-interactively against the router: every
request it sends is answered 2xx, it exits 0, and each turn is stored exactly as the engine sampled it.

The tiny model writes noise, so the program gets a text reply and ends its episode there: whether a
tool call and its result continue one segment is shown on the dialects' own tests (tests/router)."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest

from tests.programs.conftest import SHORT, TASK, program

pytestmark = pytest.mark.slow


def start_episode(harness, name: str) -> tuple[dict, int, int]:
    session = harness.router.new_session(group_id=f"g-{name}", sampling_defaults=SHORT)
    return session, len(harness.router.engine_log), len(harness.statuses.seen)


def test_codex_exec(harness, tmp_path):
    session, start, seen = start_episode(harness, "codex")
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    # Codex reads its base URL from config.toml only (OPENAI_BASE_URL is no longer read, 0.171)
    (home / "config.toml").write_text(f'openai_base_url = "{session["base_url"]}"\n')
    argv = [program("codex"), "exec", "--skip-git-repo-check", TASK]
    r = harness.run(argv, {"CODEX_HOME": str(home), "OPENAI_API_KEY": session["api_key"]}, work)
    assert r.returncode == 0, r.stderr[-3000:]
    # Codex tries the Responses WebSocket first; refused, it falls back to HTTP (no HTTP request is refused)
    assert "/responses" in harness.posts(seen)
    harness.check_episode(session, start, seen)


def test_claude_code_print(harness, tmp_path):
    session, start, seen = start_episode(harness, "claude")
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "ANTHROPIC_BASE_URL": session["base_url"].removesuffix("/v1"),
        "ANTHROPIC_API_KEY": session["api_key"],
        # no internet here: no update checks, telemetry or error reports
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    r = harness.run([program("claude"), "-p", TASK], env, work)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "/messages" in harness.posts(seen)
    harness.check_episode(session, start, seen)


def test_opencode_run(harness, tmp_path):
    session, start, seen = start_episode(harness, "opencode")
    work = tmp_path / "work"
    work.mkdir()
    # opencode takes an OpenAI-compatible server as a provider of its config; OPENCODE_CONFIG_CONTENT
    # carries it without a file (its `@ai-sdk/openai-compatible` provider ships inside the binary)
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "options": {"baseURL": session["base_url"], "apiKey": session["api_key"]},
    }
    config = {"provider": {"slimeish": {**provider, "models": {"tiny": {}}}}, "model": "slimeish/tiny"}
    env = {"OPENCODE_CONFIG_CONTENT": json.dumps(config), "OPENCODE_DISABLE_AUTOUPDATE": "1"}
    r = harness.run([program("opencode"), "run", TASK], env, work)
    assert r.returncode == 0 and "Error" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    assert harness.posts(seen).count("/chat/completions") >= 2  # the episode's turn and its title
    samples = harness.check_episode(session, start, seen)
    # the title request (its own system prompt, no tools) is a segment of its own
    assert len(samples) >= 2


def test_mini_swe_agent(harness, tmp_path):
    session, start, seen = start_episode(harness, "mini")
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "OPENAI_API_BASE": session["base_url"],  # litellm's `openai/` models: any OpenAI-compatible server
        "OPENAI_API_KEY": session["api_key"],
        "MSWEA_CONFIGURED": "true",  # skips its first-run setup questions
        "MSWEA_COST_TRACKING": "ignore_errors",  # litellm knows no price for this model
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no internet: litellm's bundled price list
    }
    # the noise the tiny model writes is a format error to it, answered by another turn, with no
    # step limit by default: its default config (mini.yaml) plus a limit of 3 steps
    limit = ["-c", "mini.yaml", "-c", "agent.step_limit=3"]
    argv = [str(Path(sys.executable).parent / "mini"), "-m", "openai/tiny", "-t", TASK, "-y", "--exit-immediately"]
    argv += limit
    r = harness.run(argv, env, work)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert harness.posts(seen) == ["/chat/completions"] * 3
    # each sample exact; each turn after the first is its own segment, `history_edited`: mini-swe-agent
    # sends the reply back changed (what it changes is not yet looked into)
    samples = harness.check_episode(session, start, seen)
    assert [s.split_reason for s in samples] == [None, "history_edited", "history_edited"]


def test_gemini_cli(harness, tmp_path):
    session, start, seen = start_episode(harness, "gemini")
    work, settings = tmp_path / "work", tmp_path / "home" / ".gemini" / "settings.json"
    work.mkdir()
    settings.parent.mkdir(parents=True)
    # the API-key auth must be chosen in its settings (GOOGLE_GEMINI_BASE_URL alone selects its
    # "gateway" auth, which `-p` refuses); no internet here: no usage statistics or update checks
    config = {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    }
    settings.write_text(json.dumps(config))
    env = {
        "GOOGLE_GEMINI_BASE_URL": session["base_url"].removesuffix("/v1"),  # it appends /v1beta/models/...
        "GEMINI_API_KEY": session["api_key"],
        "GEMINI_CLI_TRUST_WORKSPACE": "true",  # `-p` runs only in a trusted folder
    }
    r = harness.run([program("gemini"), "-p", TASK], env, work)
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
