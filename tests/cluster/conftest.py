"""A Ray cluster of several nodes simulated on this machine (Ray's own `cluster_utils`), and the
stand-in router of the demo tests, for the agent workers' tests; the train tests' prompt set,
for the runs of `--launcher ray`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from tests.demo.conftest import router, stand_in_router
from tests.train.conftest import prompts

__all__ = ["RayCluster", "prompts", "ray_cluster", "router", "stand_in_router"]


@dataclass
class RayCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    agents_node: Any  # ray._private.node.Node: the node with the custom resource "agents"

    @property
    def agents_node_id(self) -> str:
        return self.agents_node.node_id


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """A head with 1 CPU and a node with 2 CPUs and the resource `agents`, this process its driver."""

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    agents = cluster.add_node(num_cpus=2, resources={"agents": 4})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield RayCluster(cluster, agents)
    finally:
        ray.shutdown()
        cluster.shutdown()
