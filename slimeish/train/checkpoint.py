"""Save and resume a run: the trainer's checkpoint plus where the prompts and the buffer stood."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slimeish.data import DataSource
from slimeish.train.slime_hooks import PluginDataSource

if TYPE_CHECKING:
    from slimeish.train.parts import TrainerHandle


def save(trainer: TrainerHandle, data: DataSource, root: Path, step: int, unacked: list[str]) -> None:
    """Checkpoint, recording the groups it holds that the buffer has not acknowledged yet."""
    state = {"rollout_step": step, "unacked_groups": list(unacked), **data.state()}
    trainer.save(root / f"step_{step:06d}", data_state=state)
    tmp = root / "latest.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(f"step_{step:06d}")
    tmp.replace(root / "latest")  # atomic: `latest` always names a complete checkpoint
    if isinstance(data, PluginDataSource):  # slime's data source saves its own state with the checkpoint
        data.save(step)


def resume(trainer: TrainerHandle, data: DataSource, load: Path | None) -> tuple[int, dict[str, Any]]:
    """Restore the trainer from `load`; prompts continue after the last ones handed out (the
    run dir's data_state.json), not the checkpoint's: groups opened after the checkpoint are
    still in the buffer and will be trained, so their prompts must not be generated again.
    Returns the step to start from and the checkpoint's state (empty for a fresh run)."""
    if load is None:
        return 0, {}
    state = trainer.load(load)
    drawn = data.state_path and data.state_path.exists() and json.loads(data.state_path.read_text())
    data.load_state(drawn or state)
    if isinstance(data, PluginDataSource):
        data.load(int(state["rollout_step"]))
    return int(state["rollout_step"]), state
