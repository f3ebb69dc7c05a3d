"""A Ray cluster of several nodes simulated on this machine (Ray's own `cluster_utils`), and the
stand-in router of the demo tests, for the agent workers' tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from tests.demo.conftest import router, stand_in_router

__all__ = ["RayCluster", "ray_cluster", "router", "stand_in_router"]


@dataclass
class RayCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    agents_node_id: str  # the node with the custom resource "agents"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """A head with 1 CPU and a node with 2 CPUs and the resource `agents`, this process its driver."""

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    agents = cluster.add_node(num_cpus=2, resources={"agents": 4})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield RayCluster(cluster, agents.node_id)
    finally:
        ray.shutdown()
        cluster.shutdown()
