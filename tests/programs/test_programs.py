"""Each agent program, as installed and with its default configuration, given only a session's URL
and key in its own way (docs/agents.md), runs one task non-interactively against the router: every
request it sends is answered 2xx, it exits 0, and each turn is stored exactly as the engine sampled it.

The tiny model writes noise, so the program gets a text reply and ends its episode there: whether a
tool call and its result continue one segment is shown on the dialects' own tests (tests/router)."""

from __future__ import annotations

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
    assert any(path == "/responses" and method == "POST" for method, path, _ in harness.statuses.seen[seen:])
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
    assert any(path == "/messages" and method == "POST" for method, path, _ in harness.statuses.seen[seen:])
    harness.check_episode(session, start, seen)
