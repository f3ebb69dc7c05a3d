"""What a run directory holds for the viewer: `metrics.jsonl` (one row per step) and
`trained_groups.jsonl` (the group ids each step trained on), both written by `slimeish train`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METRICS = "metrics.jsonl"
LEDGER = "trained_groups.jsonl"


def run_dirs(root: Path) -> dict[str, Path]:
    """Run id -> directory: `root` itself if it is a run (the run id is its name, as
    `slimeish train` names it), else its subdirectories that are."""
    if _is_run(root):
        return {root.resolve().name: root}
    if not root.is_dir():
        return {}
    return {d.name: d for d in sorted(root.iterdir()) if d.is_dir() and _is_run(d)}


def _is_run(path: Path) -> bool:
    return (path / METRICS).exists() or (path / LEDGER).exists()


def read_jsonl(path: Path, after_step: int = -1) -> list[dict[str, Any]]:
    """Rows of a per-step JSONL file whose "step" is above `after_step` (a live page asks for
    the rows it does not have yet). A line still being written is left for the next read."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("step", -1) > after_step:
            rows.append(row)
    return rows


def step_groups(run_dir: Path | None) -> dict[int, list[str]]:
    """Step -> the ids of the groups it trained on (the last line of a step wins, as on resume)."""
    if run_dir is None:
        return {}
    return {row["step"]: row["groups"] for row in read_jsonl(run_dir / LEDGER)}
