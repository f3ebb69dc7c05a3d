"""Expert parallel on CPU: two gloo ranks with --expert-model-parallel-size 2, each holding two of a
tiny Qwen3-MoE's four experts, take the same optimizer step as one rank holding all four.

The ranks split the samples (data parallel for the dense weights) and dispatch their tokens to the
experts' ranks. The batch of 5 samples, one per micro-batch, gives rank 0 three micro-batches and
rank 1 two, so rank 1 runs an idle one to pair up the MoE collectives. With one sample per
micro-batch each micro-batch's load-balancing loss is the same on one rank or two, so the step's
aux loss (its gradient and its metric, a mean over the five real micro-batches) is too: the idle
micro-batch must add neither.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from transformers import LlamaConfig

from slimeish.common.procs import free_port
from slimeish.trainer.config import LossConfig, TrainerConfig
from slimeish.trainer.hf_io import read_hf_weights
from slimeish.trainer.model import transformer_config
from slimeish.trainer.trainer import Trainer
from tests.trainer.conftest import tiny_qwen3_moe
from tests.trainer.trainer_helpers import random_samples

TOLERANCE = 1e-5  # float32 sums in another order (other micro-batch shapes, gathered expert inputs)
LR = 1e-3


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory) -> Path:
    return tiny_qwen3_moe(tmp_path_factory.mktemp("qwen3_moe_aux"), router_aux_loss_coef=0.5)


def _config(model: Path, ep: int) -> TrainerConfig:
    return TrainerConfig(model_path=model, lr=LR, micro_batch_tokens=1, expert_model_parallel_size=ep)


def _assert_same_update(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    """Adam's first step is lr * g / (|g| + eps): where a gradient is within float32 summation noise
    of zero, that noise alone moves the weight anywhere in +-lr (a fresh-clone run had one such
    element past 1e-5). So every element within 2 lr, and all but a few (0.1 %) within TOLERANCE:
    a wrong expert, route or gradient sum moves far more than that."""
    diff = (got - want).abs()
    assert diff.max().item() <= 2 * LR + TOLERANCE, f"{name}: {diff.max().item():.3g}"
    off = int((diff > TOLERANCE).sum())
    assert off <= max(2, diff.numel() // 1000), f"{name}: {off} of {diff.numel()} elements off by > {TOLERANCE}"


def _samples():
    return random_samples(1, 5, seed=7, vocab=300)


def _rank(rank: int, port: int, model: Path, out: Path) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")  # fmt: skip
    trainer = Trainer(_config(model, ep=2), LossConfig())
    held = {n.split("local_experts.")[1].split(".")[0] for n in trainer.model.state_dict() if "local_experts." in n}
    metrics = trainer.train_step(_samples())
    trainer.export_hf(out / "hf")
    trainer.save(out / "ckpt")
    resumed = Trainer(_config(model, ep=2), LossConfig())
    resumed.load(out / "ckpt")
    result = dict(held=held, metrics=metrics, weights=trainer.hf_state_dict(), resumed=resumed.hf_state_dict())
    torch.save(result, out / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


def test_two_expert_parallel_ranks_take_the_step_one_rank_takes(moe_model, tmp_path):
    mp.spawn(_rank, args=(free_port(), moe_model, tmp_path), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert [r["held"] for r in ranks] == [{"0", "1"}, {"0", "1"}]  # two local experts each (of four)
    alone = Trainer(_config(moe_model, ep=1), LossConfig())  # this process: a world of one (conftest)
    initial = alone.hf_state_dict()
    metrics = alone.train_step(_samples())
    weights = alone.hf_state_dict()

    # Each rank reports the whole batch's loss and token count (gathered over the ranks), and the whole
    # model's gradient norm. The idle micro-batch that pairs up rank 1's collectives adds no tokens.
    for r in ranks:
        assert r["metrics"]["loss"] == pytest.approx(metrics["loss"], abs=TOLERANCE)
        assert r["metrics"]["tokens"] == metrics["tokens"]
        assert r["metrics"]["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=TOLERANCE)
        assert r["metrics"]["moe_aux_loss"] == pytest.approx(metrics["moe_aux_loss"], rel=TOLERANCE)
    exported = read_hf_weights(tmp_path / "hf")  # the checkpoint's per-expert names
    assert set(exported) == set(weights)
    moved = [k for k in weights if not torch.equal(weights[k], initial[k])]
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in moved and "model.layers.1.mlp.gate.weight" in moved
    for name, weight in weights.items():
        for r in ranks:
            assert torch.equal(r["weights"][name], ranks[0]["weights"][name]), name  # gathered alike on both
            assert torch.equal(r["resumed"][name], r["weights"][name]), name  # the checkpoint restores it
        _assert_same_update(ranks[0]["weights"][name], weight, name)
        _assert_same_update(exported[name], weight, name)
    with pytest.raises(ValueError, match="saved with --expert-model-parallel-size 2"):
        alone.load(tmp_path / "ckpt")  # each rank's file holds half the experts


def test_expert_parallel_that_does_not_divide_the_experts_is_refused(moe_model):
    from transformers import AutoConfig

    with pytest.raises(ValueError, match=r"size 3 must divide the routed experts \(4"):
        transformer_config(AutoConfig.from_pretrained(moe_model), params_dtype=torch.float32, use_gpu=False,
                           expert_parallel=3)  # fmt: skip
    dense = LlamaConfig(vocab_size=300, hidden_size=64, num_hidden_layers=1, num_attention_heads=4)
    with pytest.raises(ValueError, match="expert parallel is for MoE models only"):
        transformer_config(dense, params_dtype=torch.float32, use_gpu=False, expert_parallel=2)
