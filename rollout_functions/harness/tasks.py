"""Tasks in Harbor's format (Terminal-Bench 2), and a folder of them as prompt data.

A task is a directory:

    instruction.md      what the agent is told
    task.toml           [agent] timeout_sec/env, [verifier] timeout_sec/env, [environment] build_timeout_sec/
                        cpus/memory_mb, and network_mode (per [environment], [agent], [verifier])
    environment/        how the workspace is built: `workspace/` (files copied into /app) and an
                        optional `setup.sh` run in /app; a Harbor `Dockerfile` is for container providers
    tests/test.sh       run in /app after the agent; writes /logs/verifier/reward.txt (a number) or reward.json
    solution/solve.sh   optional reference solution (Harbor's oracle)

The prompt data of a harness run is JSONL naming tasks: `{"prompt": <instruction>, "label": <task dir>}`,
which `python -m slimeish.rollout_functions.harness.tasks TASKS_DIR --out FILE` writes for a folder.
"""

from __future__ import annotations

import argparse
import functools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slimeish.data import write_prompts

# Harbor's defaults when task.toml leaves a value out.
AGENT_TIMEOUT_S = 600.0
VERIFIER_TIMEOUT_S = 600.0
BUILD_TIMEOUT_S = 600.0
MEMORY_MB = 2048
# Harbor's network modes a local sandbox can honour; unlike Harbor (default "public") the network is
# off unless a task asks for it ("allowlist" needs a filtering proxy: not here)
NETWORK_MODES = ("public", "no-network")
DEFAULT_NETWORK_MODE = "no-network"


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    path: Path
    name: str
    instruction: str
    agent_timeout_s: float = AGENT_TIMEOUT_S
    verifier_timeout_s: float = VERIFIER_TIMEOUT_S
    build_timeout_s: float = BUILD_TIMEOUT_S  # building the environment (locally: setup.sh)
    cpus: float | None = None
    memory_mb: int = MEMORY_MB
    agent_env: dict[str, str] = field(default_factory=dict)
    verifier_env: dict[str, str] = field(default_factory=dict)
    # whether each phase may reach the internet: building the environment (setup.sh), the agent, the tests
    setup_internet: bool = False
    agent_internet: bool = False
    verifier_internet: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def workspace(self) -> Path:
        """The files the workspace starts with (may be absent: an empty workspace)."""
        return self.path / "environment" / "workspace"

    @property
    def setup_script(self) -> Path:
        return self.path / "environment" / "setup.sh"

    @property
    def tests(self) -> Path:
        return self.path / "tests"

    @property
    def solution(self) -> Path:
        return self.path / "solution"


def _table(config: dict[str, Any], name: str, where: Path) -> dict[str, Any]:
    value = config.get(name, {})
    if not isinstance(value, dict):
        raise ValueError(f"{where}: [{name}] must be a table, got {value!r}")
    return value


def _env(table: dict[str, Any], where: Path) -> dict[str, str]:
    return {str(k): str(v) for k, v in _table(table, "env", where).items()}


def _internet(table: dict[str, Any], where: Path, default: str) -> bool:
    """Whether `table`'s `network_mode` (or Harbor's older `allow_internet`) lets it out."""
    mode = table.get("network_mode")
    if mode is None and "allow_internet" in table:
        mode = "public" if table["allow_internet"] else "no-network"
    mode = default if mode is None else mode
    if mode not in NETWORK_MODES:
        raise ValueError(f"{where}: network_mode must be one of {NETWORK_MODES}, got {mode!r}")
    return bool(mode == "public")


@functools.cache
def load_task(path: str | Path) -> Task:
    """The task at `path`; a ValueError names what is missing or malformed."""
    root = Path(path).resolve()
    for required in ("instruction.md", "task.toml", "tests/test.sh"):
        if not (root / required).is_file():
            raise ValueError(f"{root} is not a Harbor task: it has no {required}")
    toml_path = root / "task.toml"
    try:
        config = tomllib.loads(toml_path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{toml_path}: {exc}") from exc
    agent, verifier = _table(config, "agent", toml_path), _table(config, "verifier", toml_path)
    env = _table(config, "environment", toml_path)
    setup_internet = _internet(env, toml_path, DEFAULT_NETWORK_MODE)
    baseline = "public" if setup_internet else "no-network"  # [agent] and [verifier] override the environment's
    return Task(
        path=root,
        name=root.name,
        instruction=(root / "instruction.md").read_text(),
        agent_timeout_s=float(agent.get("timeout_sec", AGENT_TIMEOUT_S)),
        verifier_timeout_s=float(verifier.get("timeout_sec", VERIFIER_TIMEOUT_S)),
        build_timeout_s=float(env.get("build_timeout_sec", BUILD_TIMEOUT_S)),
        cpus=env.get("cpus"),
        memory_mb=int(env.get("memory_mb", MEMORY_MB)),
        agent_env=_env(agent, toml_path),
        verifier_env=_env(verifier, toml_path),
        setup_internet=setup_internet,
        agent_internet=_internet(agent, toml_path, baseline),
        verifier_internet=_internet(verifier, toml_path, baseline),
        metadata=_table(config, "metadata", toml_path),
    )


def find_tasks(folder: Path) -> list[Task]:
    """Every task directly under `folder`, by name."""
    tasks = [load_task(p) for p in sorted(Path(folder).iterdir()) if (p / "task.toml").is_file()]
    if not tasks:
        raise ValueError(f"{folder}: no task directories (each holds a task.toml)")
    return tasks


def task_records(folder: Path) -> list[dict[str, Any]]:
    """The prompt records of every task in `folder`: the instruction, and the task's path as the label."""
    return [{"prompt": t.instruction, "label": str(t.path), "metadata": {"task": t.name}} for t in find_tasks(folder)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="write the prompt JSONL of a folder of Harbor tasks")
    parser.add_argument("tasks", type=Path, help="folder of task directories")
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    args = parser.parse_args(argv)
    write_prompts(args.out, task_records(args.tasks))


if __name__ == "__main__":
    main()
