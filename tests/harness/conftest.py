"""Fixtures of the harness tests: the example tasks, tasks written per test, and a sandbox lost from outside."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Iterator
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


def processes_started_in(directory: Path) -> list[int]:
    """Live processes whose working directory is `directory` (a sandbox command's outermost process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # it ended while we looked
                if os.readlink(entry / "cwd") == str(directory.resolve()):
                    found.append(int(entry.name))
    return found


@contextlib.contextmanager
def sandbox_lost_when_marked(root: Path, mark: str) -> Iterator[threading.Event]:
    """From outside, as a lost machine or a removed container would be: once a sandbox under `root`
    holds `app/<mark>`, remove its directory and kill its commands' process groups. The event is set
    once that is done."""
    done, stop = threading.Event(), threading.Event()

    def watch() -> None:
        while not stop.wait(0.1):
            for marked in root.glob(f"*/app/{mark}"):
                box = marked.parent.parent
                groups = {os.getpgid(pid) for pid in processes_started_in(box / "app")}
                shutil.rmtree(box)
                for group in groups:
                    os.killpg(group, signal.SIGKILL)
                done.set()
                return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join()
