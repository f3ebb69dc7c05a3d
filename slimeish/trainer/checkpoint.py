"""Resumable trainer checkpoints: model, optimizer, step, weight version and the data position.

A checkpoint is a directory written under a temporary name and renamed into place, so a crash
mid-save never leaves a half-written checkpoint that `load` would accept.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from slimeish.trainer.distributed import global_rank

STATE_FILE = "trainer_state.json"


@dataclass(kw_only=True)
class TrainerState:
    step: int = 0  # optimizer steps taken
    weight_version: int = 0  # version of the weights the engines should serve
    data_state: dict[str, Any] = field(default_factory=dict)  # the train loop's data position
    expert_parallel: int = 1  # each rank's file holds 1 / expert_parallel of the routed experts


def save_checkpoint(out_dir: Path, *, model: torch.nn.Module, optimizer: Any, state: TrainerState) -> Path:
    """Every rank writes its own model and optimizer files; rank 0 the state and the final rename."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    rank = global_rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    torch.save(model.state_dict(), tmp / f"model_rank{rank:03d}.pt")
    torch.save(optimizer.state_dict(), tmp / f"optimizer_rank{rank:03d}.pt")
    _barrier()
    if rank == 0:
        (tmp / STATE_FILE).write_text(json.dumps(asdict(state), indent=1))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    _barrier()
    return out_dir


def load_checkpoint(
    ckpt_dir: Path, *, model: torch.nn.Module, optimizer: Any, expert_parallel: int = 1
) -> TrainerState:
    ckpt_dir, rank = Path(ckpt_dir), global_rank()
    if not (ckpt_dir / STATE_FILE).exists():
        raise ValueError(f"{ckpt_dir} is not a trainer checkpoint (no {STATE_FILE})")
    state = TrainerState(**json.loads((ckpt_dir / STATE_FILE).read_text()))
    if state.expert_parallel != expert_parallel:
        raise ValueError(
            f"{ckpt_dir} was saved with --expert-model-parallel-size {state.expert_parallel}; resume it with the "
            f"same (this run has {expert_parallel}), or export it to HF (export_hf) and start from that"
        )
    model.load_state_dict(torch.load(ckpt_dir / f"model_rank{rank:03d}.pt", weights_only=False))
    optimizer.load_state_dict(torch.load(ckpt_dir / f"optimizer_rank{rank:03d}.pt", weights_only=False))
    return state


def _barrier() -> None:
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()
