"""`--trainer-world-size 2`: the trainer as two data-parallel rank actors (gloo) on the node with
the custom resource `trainer`, on a Ray cluster simulated on this machine. The run trains every
step once with exact capture, and the ranks ran where their resources say (Ray's state API)."""

from __future__ import annotations

import pytest
import torch

from slimeish.common.procs import ManagedProcess
from tests.cluster.conftest import actor_nodes, simulated_cluster
from tests.train.test_faults import STEPS, check_exactly_once, fault_argv, wait_for
from tests.train.test_train_e2e import metrics

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture
def cluster():
    head = {"num_cpus": 3, "resources": {"parts": 3}}
    with simulated_cluster(head, trainer={"num_cpus": 2, "resources": {"trainer": 2}}) as c:
        yield c


def test_two_trainer_ranks_as_actors_train_every_step_once(tiny_model, prompts, tmp_path, cluster):
    run_dir = tmp_path / "ranks"
    argv = fault_argv(
        tiny_model, prompts, run_dir, "--launcher", "ray", "--ray-address", cluster.address,
        "--trainer-world-size", "2", "--trainer-resources", '{"trainer": 1}', "--engine-resources", '{"parts": 1}',
        "--router-resources", '{"parts": 1}', "--buffer-resources", '{"parts": 1}',
    )  # fmt: skip
    log = tmp_path / "train.log"
    with ManagedProcess(argv, log_path=log) as proc:
        ranks = {"trainer0", "trainer1"}
        wait_for(lambda: ranks <= actor_nodes(run_dir.name).keys(), "both ranks in Ray's state API", proc)
        placed = actor_nodes(run_dir.name)  # while the run's actors are alive
        assert proc.proc.wait(600) == 0, log.read_text()[-3000:]
    trainer = cluster.nodes_by_role["trainer"].node_id
    assert placed["trainer0"] == placed["trainer1"] == trainer, placed
    assert "trainer ranks on nodes" in log.read_text()
    steps = [r for r in metrics(run_dir) if "train/loss" in r]
    assert len(steps) == STEPS
    assert all(r["train/rollout_logprob_abs_diff_max"] <= 1e-4 for r in steps)  # exact capture, rank 0's half
    check_exactly_once(run_dir)
    # Each rank saved its own files; the gradient all-reduce kept their weights equal.
    latest = run_dir / "checkpoints" / "latest"
    rank0, rank1 = (torch.load(latest / f"model_rank{r:03d}.pt", weights_only=False) for r in range(2))
    assert rank0.keys() == rank1.keys()
    tensors = [k for k, v in rank0.items() if isinstance(v, torch.Tensor)]
    assert tensors and all(torch.equal(rank0[k], rank1[k]) for k in tensors)
