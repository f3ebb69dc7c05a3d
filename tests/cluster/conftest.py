"""A Ray cluster of several nodes simulated on this machine (Ray's own `cluster_utils`), and the
stand-in router of the demo tests, for the agent workers' tests; the train tests' prompt set,
for the runs of `--launcher ray`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from slimeish.common.procs import free_port
from tests.demo.conftest import router, stand_in_router
from tests.train.conftest import prompts

__all__ = [
    "RayCluster",
    "actor_nodes",
    "list_actors",
    "prompts",
    "ray_cluster",
    "router",
    "simulated_cluster",
    "stand_in_router",
]


@contextmanager
def simulated_cluster(head: dict[str, Any], *, dashboard: bool = True, **nodes: dict[str, Any]) -> Iterator[Any]:
    """A Ray cluster simulated on this machine (Ray's `cluster_utils`): a head and one node per
    keyword (its `add_node` arguments), this process its driver; `nodes_by_role` maps "head" and
    each keyword to its node. With `dashboard` the head serves the state API, on a port of its own
    (another cluster may hold the default)."""
    if dashboard:
        head = head | {"include_dashboard": True, "dashboard_port": free_port()}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    cluster.nodes_by_role = {"head": cluster.head_node} | {role: cluster.add_node(**a) for role, a in nodes.items()}
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def actor_nodes(run_id: str) -> dict[str, str]:
    """The node of each of the run's live actors, by part name, as Ray's state API reports it."""
    alive = list_actors(filters=[("state", "=", "ALIVE")], limit=1000)
    return {a.name.removeprefix(f"{run_id}/"): a.node_id for a in alive if (a.name or "").startswith(f"{run_id}/")}


def list_actors(**kwargs: Any) -> list[Any]:
    """Ray's `list_actors` on the cluster this process is connected to (left to find one itself,
    it takes the newest on the machine, which may be another test's)."""
    from ray.util import state

    return state.list_actors(address=ray.get_runtime_context().gcs_address, **kwargs)


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
    agents = {"num_cpus": 2, "resources": {"agents": 4}}
    with simulated_cluster({"num_cpus": 1}, dashboard=False, agents=agents) as cluster:
        yield RayCluster(cluster, cluster.nodes_by_role["agents"])
