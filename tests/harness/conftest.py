"""Fixtures of the harness tests: the example tasks, and tasks written per test."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "coding_tasks" / "tasks"


@pytest.fixture
def make_task(tmp_path):
    """Write a minimal task: `make_task(name, test_sh=..., setup_sh=..., files={...}, agent_timeout=...,
    memory_mb=..., cpus=...)`."""

    def make(
        name: str = "task",
        *,
        test_sh: str = 'echo 1 > "$LOGS_DIR/verifier/reward.txt"',
        setup_sh: str | None = None,
        files: dict[str, str] | None = None,
        agent_timeout: float = 60.0,
        memory_mb: int = 1024,
        cpus: int | None = None,
    ) -> Path:
        root = tmp_path / "tasks" / name
        (root / "tests").mkdir(parents=True)
        (root / "environment" / "workspace").mkdir(parents=True)
        (root / "instruction.md").write_text(f"do {name}\n")
        environment = f"[environment]\nmemory_mb = {memory_mb}\n" + (f"cpus = {cpus}\n" if cpus else "")
        agent = f"[agent]\ntimeout_sec = {agent_timeout}\n\n[verifier]\ntimeout_sec = 30.0\n"
        (root / "task.toml").write_text(f"{environment}\n{agent}")
        (root / "tests" / "test.sh").write_text(test_sh + "\n")
        if setup_sh is not None:
            (root / "environment" / "setup.sh").write_text(setup_sh + "\n")
        for rel, text in (files or {}).items():
            (root / "environment" / "workspace" / rel).write_text(text)
        return root

    return make
