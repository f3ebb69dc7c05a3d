"""Where each role of a run goes on a Ray cluster: the flags of `--launcher ray`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimeish.common.config import help_field


@dataclass(kw_only=True)
class ClusterConfig:
    launcher: Literal["local", "ray"] = help_field(
        "local", help="local: start the parts as children of this process; ray: place them on a Ray cluster"
    )
    ray_address: str | None = help_field(
        None, help="Ray cluster to join (default: $RAY_ADDRESS, else a Ray started on this machine)"
    )
    engine_backend: Literal["embedded", "sglang"] = help_field(
        "embedded",
        help="--launcher ray: embedded starts `slimeish engine` (--engine-device); sglang starts SGLang's "
        "launch_server on the GPUs Ray gives the actor (--tp-size = --engine-num-gpus)",
    )
    engine_num_gpus: float = help_field(0.0, help="GPUs each engine actor reserves (--launcher ray)")
    engine_num_cpus: float = help_field(1.0, help="CPUs each engine actor reserves (--launcher ray)")
    engine_resources: dict[str, float] = help_field(
        {}, help="custom Ray resources each engine needs, as JSON: '{\"gpu_node\": 1}' (--launcher ray)"
    )
    router_num_cpus: float = help_field(1.0, help="CPUs each router actor reserves (--launcher ray)")
    router_resources: dict[str, float] = help_field({}, help="custom Ray resources each router needs, as JSON")
    buffer_num_cpus: float = help_field(1.0, help="CPUs the buffer server's actor reserves (--launcher ray)")
    buffer_resources: dict[str, float] = help_field({}, help="custom Ray resources the buffer server needs, as JSON")
    trainer_world_size: int = help_field(
        0,
        help="--launcher ray: the trainer as this many data-parallel rank actors (gloo on CPU, NCCL on GPU), "
        "placed together by a placement group; 0: the trainer runs in this process",
    )
    trainer_num_cpus: float = help_field(1.0, help="CPUs each trainer rank reserves (--trainer-world-size)")
    trainer_num_gpus: float = help_field(0.0, help="GPUs each trainer rank reserves (--trainer-world-size)")
    trainer_resources: dict[str, float] = help_field(
        {}, help="custom Ray resources each trainer rank needs, as JSON: '{\"trainer\": 1}' (--trainer-world-size)"
    )

    def __post_init__(self) -> None:
        if self.trainer_world_size < 0:
            raise ValueError("--trainer-world-size must be >= 0")
        if self.trainer_world_size and self.launcher != "ray":
            raise ValueError("--trainer-world-size places trainer ranks on a Ray cluster: add --launcher ray")


@dataclass(frozen=True)
class Placement:
    """What one part's actor reserves on the node Ray picks."""

    num_cpus: float
    num_gpus: float = 0.0
    resources: dict[str, float] | None = None

    def __str__(self) -> str:
        return f"{self.num_cpus:g} CPU, {self.num_gpus:g} GPU" + (f" and {self.resources}" if self.resources else "")

    @classmethod
    def of(cls, cfg: ClusterConfig, role: str) -> Placement:
        if role == "engine":
            return cls(cfg.engine_num_cpus, cfg.engine_num_gpus, cfg.engine_resources)
        if role == "router":
            return cls(cfg.router_num_cpus, 0.0, cfg.router_resources)
        if role == "trainer":
            return cls(cfg.trainer_num_cpus, cfg.trainer_num_gpus, cfg.trainer_resources)
        return cls(cfg.buffer_num_cpus, 0.0, cfg.buffer_resources)
