"""Data parallel on CPU: ranks spawned with torch.multiprocessing (gloo on loopback) sum their
gradients before the step, so every rank holds the weights a single rank would on the same batch,
and reports the whole batch's metrics (loss, tokens, token-weighted means), not its own share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from slimeish.common.procs import free_port
from slimeish.trainer.config import LossConfig, TrainerConfig
from slimeish.trainer.trainer import Trainer
from tests.trainer.trainer_helpers import random_samples

STEPS = 2


def _config(model: Path, global_batch: int) -> tuple[TrainerConfig, LossConfig]:
    return TrainerConfig(model_path=model, lr=1e-3, micro_batch_tokens=40, global_batch_size=global_batch), LossConfig()


def _train(trainer: Trainer) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    metrics = [trainer.train_step(random_samples(2, 4, seed=step)) for step in range(STEPS)]
    return trainer.hf_state_dict(), metrics


def _rank(rank: int, world: int, port: int, model: Path, global_batch: int, out: Path) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")  # fmt: skip
    torch.save(_train(Trainer(*_config(model, global_batch))), out / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


# 8 samples a step; with 1 a step, rank 1's stripe is empty every step (it adds zero gradients).
@pytest.mark.parametrize("global_batch", [8, 1])
def test_two_cpu_ranks_match_one(tiny_model, tmp_path, global_batch):
    mp.spawn(_rank, args=(2, free_port(), tiny_model, global_batch, tmp_path), nprocs=2, join=True)
    ranks, rank_metrics = zip(*(torch.load(tmp_path / f"rank{r}.pt") for r in range(2)), strict=True)
    alone, metrics = _train(Trainer(*_config(tiny_model, global_batch)))  # this process: a world of one (conftest)
    initial = Trainer(*_config(tiny_model, global_batch)).hf_state_dict()
    assert any(not torch.equal(alone[k], initial[k]) for k in alone)  # the steps changed the weights
    for name, weight in alone.items():
        assert torch.equal(ranks[0][name], ranks[1][name]), name  # the ranks did not diverge
        torch.testing.assert_close(ranks[0][name], weight, rtol=0, atol=1e-5, msg=name)
    for step, alone_step in enumerate(metrics):
        assert alone_step["tokens"] > 1 and abs(alone_step["loss"]) > 0
        for rank_step in (rank_metrics[0][step], rank_metrics[1][step]):
            assert rank_step.keys() == alone_step.keys()
            for key, value in alone_step.items():
                assert rank_step[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (step, key)
