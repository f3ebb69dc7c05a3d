"""`--trainer-world-size N`: the trainer as N data-parallel rank actors on a Ray cluster.

A placement group with one bundle per rank reserves them together (all or none). Rank 0's node
IP and a free port there are the ranks' MASTER_ADDR / MASTER_PORT; `init_distributed` picks gloo
on CPU and NCCL on GPU. The driver holds `TrainerRanks`, a facade with the surface the loop uses
of a `Trainer`: every call runs on every rank at once (a step, a checkpoint save and a weight sync
are collectives), and rank 0 answers. Each rank has its own `WeightSync`: rank 0 pushes the
weights to the engines as an in-process trainer does, the others take part in the gather.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from slimeish.cluster.config import ClusterConfig, Placement
from slimeish.cluster.part import free_port
from slimeish.common.sample import Sample
from slimeish.trainer.config import LossConfig, TrainerConfig
from slimeish.trainer.weight_sync import WeightSyncConfig

log = logging.getLogger("slimeish.cluster")


class TrainerRank:
    """One rank: its `Trainer` and `WeightSync`, built by `start` once every rank knows rank 0's address."""

    sync: Any = None  # a `WeightSync` once started

    def address(self) -> tuple[str, int, str]:
        """This node's IP, a port free on it now, and its Ray node id."""
        host = ray.util.get_node_ip_address()
        return host, free_port(host), ray.get_runtime_context().get_node_id()

    def start(
        self, rank: int, world: int, master: tuple[str, int], trainer: TrainerConfig, loss: LossConfig,
        sync: WeightSyncConfig, hook_args: dict[str, Any],
    ) -> int:  # fmt: skip
        from slimeish.trainer.trainer import Trainer
        from slimeish.trainer.weight_sync import WeightSync

        # Ray shows an actor only the GPUs it reserved (CUDA_VISIBLE_DEVICES): its device is 0.
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR=master[0],
                          MASTER_PORT=str(master[1]))  # fmt: skip
        self.trainer = Trainer(trainer, loss, hook_args)
        self.sync = WeightSync(sync)
        return self.trainer.weight_version

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        return self.trainer.train_step(samples)

    def sync_weights(self) -> dict[str, float]:
        return self.sync.sync(self.trainer)

    def serves(self, version: int) -> bool:
        return self.sync.serves(version)

    def unload_adapter(self) -> None:
        self.sync.unload_adapter()

    def save(self, out_dir: Path, data_state: dict[str, Any] | None) -> Path:
        return self.trainer.save(out_dir, data_state=data_state)

    def load(self, ckpt_dir: Path) -> tuple[dict[str, Any], int]:
        return self.trainer.load(ckpt_dir), self.trainer.weight_version

    def stop(self) -> None:
        if self.sync is not None:
            self.sync.close()


class TrainerRanks:
    """The driver's handle on the rank actors; use as a context manager (it removes them)."""

    def __init__(
        self, cluster: ClusterConfig, trainer: TrainerConfig, loss: LossConfig, sync: WeightSyncConfig, *,
        run_id: str, engine_urls: Sequence[str], startup_timeout: float, hook_args: dict[str, Any] | None = None,
    ):  # fmt: skip
        # Actors resolve relative paths from their own working directory.
        self._configs = (dataclasses.replace(trainer, model_path=Path(trainer.model_path).resolve()), loss, sync)
        self.world, self.run_id = cluster.trainer_world_size, run_id
        self.placement = Placement.of(cluster, "trainer")
        self.engine_urls, self.startup_timeout = list(engine_urls), startup_timeout
        self.hook_args = hook_args or {}  # more of the args slime's trainer hooks receive (the custom config)
        self.ranks: list[Any] = []  # handles to `TrainerRank` actors
        self.node_ids: list[str] = []
        self._weight_version = 0
        self._group: Any = None

    def __enter__(self) -> TrainerRanks:
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _start(self) -> None:
        p = self.placement
        bundle = {"CPU": p.num_cpus, **({"GPU": p.num_gpus} if p.num_gpus else {}), **(p.resources or {})}
        self._group = placement_group([bundle] * self.world, strategy="PACK", name=f"{self.run_id}/trainer")
        try:
            ray.get(self._group.ready(), timeout=self.startup_timeout)
        except GetTimeoutError:
            raise TimeoutError(
                f"{self.world} trainer ranks with {p} each could not be placed within --startup-timeout "
                f"{self.startup_timeout:.0f} s: is there room on the cluster (`ray status`)?"
            ) from None
        for i in range(self.world):
            strategy = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=i)
            self.ranks.append(
                ray.remote(TrainerRank).options(
                    name=f"{self.run_id}/trainer{i}", num_cpus=p.num_cpus, num_gpus=p.num_gpus,
                    resources=p.resources or None, scheduling_strategy=strategy, max_restarts=0,
                ).remote()
            )  # fmt: skip
        addresses = ray.get([r.address.remote() for r in self.ranks])
        self.node_ids = [node for _, _, node in addresses]
        host, port, _ = addresses[0]
        self._check_tensor_sync(host)
        trainer, loss, sync = self._configs
        if sync.method == "distributed":  # the engines join rank 0's NCCL group: its address, not loopback
            sync = dataclasses.replace(sync, nccl_master_address=host)
        started = [
            r.start.remote(i, self.world, (host, port), trainer, loss, sync, self.hook_args)
            for i, r in enumerate(self.ranks)
        ]
        self._weight_version = ray.get(started)[0]
        log.info("trainer ranks on nodes %s; rank 0 at %s:%d", [n[:8] for n in self.node_ids], host, port)

    def _check_tensor_sync(self, host: str) -> None:
        """`--weight-sync tensor` hands weights over in rank 0's shared memory."""
        elsewhere = [url for url in self.engine_urls if urlsplit(url).hostname != host]
        if self._configs[2].method == "tensor" and elsewhere:
            raise ValueError(
                f"--weight-sync tensor reaches only engines on trainer rank 0's host ({host}), and "
                f"{', '.join(elsewhere)} are not: use --weight-sync disk with a --run-dir every node mounts"
            )

    def _stop(self) -> None:
        try:  # each rank's weight sync first (the tensor method's files), then the actors
            ray.get([r.stop.remote() for r in self.ranks], timeout=30)
        except (RayActorError, GetTimeoutError) as e:
            log.warning("the trainer ranks did not stop cleanly: %r", e)
        for r in self.ranks:
            ray.kill(r, no_restart=True)
        if self._group is not None:
            remove_placement_group(self._group)

    def _all(self, method: str, *args: Any) -> list[Any]:
        return ray.get([getattr(r, method).remote(*args) for r in self.ranks])

    # ---- what the loop uses of a trainer -------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._weight_version

    def train_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One step on every rank (each trains its stripe of `samples`); rank 0's metrics."""
        metrics = self._all("train_step", ray.put(list(samples)))[0]
        self._weight_version = int(metrics["weight_version"])
        return metrics

    def save(self, out_dir: str | Path, data_state: dict[str, Any] | None = None) -> Path:
        return self._all("save", Path(out_dir).resolve(), data_state)[0]

    def load(self, ckpt_dir: str | Path) -> dict[str, Any]:
        data_state, self._weight_version = self._all("load", Path(ckpt_dir).resolve())[0]
        return data_state

    def sync_weights(self) -> dict[str, float]:
        """The engines to the ranks' current weights (rank 0 pushes); rank 0's timings."""
        return self._all("sync_weights")[0]

    def serves(self, version: int) -> bool:
        return ray.get(self.ranks[0].serves.remote(version))

    def unload_adapter(self) -> None:
        ray.get(self.ranks[0].unload_adapter.remote())


class RanksSync:
    """The loop's weight sync when the trainer is `TrainerRanks`: it runs inside the ranks."""

    def __init__(self, ranks: TrainerRanks):
        self.ranks = ranks

    def sync(self, trainer: TrainerRanks) -> dict[str, float]:
        return trainer.sync_weights()

    def serves(self, version: int) -> bool:
        return self.ranks.serves(version)

    def unload_adapter(self) -> None:
        self.ranks.unload_adapter()
