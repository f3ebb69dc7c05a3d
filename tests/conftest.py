"""Shared fixtures: tiny models built once per test session, in Hugging Face format."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slimeish.models.tiny import MOE_ARCHS, TinyModelConfig, make_tiny_model

# A session key as the router issues it (`sk-slimeish-` + 43 url-safe characters); a masked one
# (`sk-slimeish-<redacted>`, `/s/<redacted>/`) does not match.
_SESSION_KEY = re.compile(r"sk-slimeish-[A-Za-z0-9_\-]{16,}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A session key is a credential: a test whose captured log records or stderr (any phase)
    hold one unmasked errors at teardown, naming where. Subprocesses' log files are checked by
    tests/router/test_log_redaction.py."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "teardown" or report.failed:
        return
    for title, text in report.sections:
        if ("stderr" in title or "log" in title) and (found := _SESSION_KEY.search(text)):
            before = text[max(0, found.start() - 300) : found.end()]
            report.outcome, report.longrepr = "failed", f"an unmasked session key in {title}: ...{before}"
            return


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """Build (once per arch and family) and return the directory of a tiny model: `factory("qwen3")`,
    `factory(family="qwen3")` (Qwen3's chat template and renderer)."""
    built: dict[tuple, Path] = {}

    def factory(arch: str | None = "qwen2", family: str = "chatml") -> Path:
        key = (arch, family) if family == "chatml" or arch in MOE_ARCHS else (None, family)
        if key not in built:
            cfg = TinyModelConfig(arch=key[0], family=family)  # type: ignore[arg-type]  # tests pass names
            built[key] = make_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}-{family}"), cfg)
        return built[key]

    return factory


@pytest.fixture(scope="session")
def tiny_model(tiny_model_factory) -> Path:
    """The default tiny Qwen2 model directory."""
    return tiny_model_factory("qwen2")
