"""`--launcher ray`'s flags, and Ray staying optional: nothing imports it unless a run asks for it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slimeish.cluster import ClusterConfig
from slimeish.cluster.config import Placement
from slimeish.train.setup import parse_args


def test_placement_flags_parse_into_the_cluster_config(tmp_path):
    setup = parse_args([
        "--model-path", str(tmp_path), "--prompt-data", str(tmp_path / "p.jsonl"), "--launcher", "ray",
        "--ray-address", "10.0.0.1:6379", "--engine-num-gpus", "1", "--engine-resources", '{"gpu_node": 1}',
        "--router-num-cpus", "2", "--router-resources", '{"cpu_node": 0.5}',
    ])  # fmt: skip
    cluster = setup.cluster
    assert (cluster.launcher, cluster.ray_address) == ("ray", "10.0.0.1:6379")
    assert Placement.of(cluster, "engine") == Placement(1.0, 1.0, {"gpu_node": 1})
    assert Placement.of(cluster, "router") == Placement(2.0, 0.0, {"cpu_node": 0.5})
    assert Placement.of(cluster, "buffer") == Placement(1.0, 0.0, {})
    assert ClusterConfig().launcher == "local"  # the local launcher stays the default


def test_trainer_rank_flags(tmp_path, capsys):
    argv = ["--model-path", str(tmp_path), "--prompt-data", str(tmp_path / "p.jsonl"), "--trainer-world-size", "2"]
    setup = parse_args([*argv, "--launcher", "ray", "--trainer-num-cpus", "2", "--trainer-resources", '{"trainer": 1}'])
    assert setup.cluster.trainer_world_size == 2
    assert Placement.of(setup.cluster, "trainer") == Placement(2.0, 0.0, {"trainer": 1})
    assert ClusterConfig().trainer_world_size == 0  # the trainer runs in the driver process
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert "--trainer-world-size places trainer ranks on a Ray cluster: add --launcher ray" in capsys.readouterr().err


def test_slimeish_imports_without_ray():
    code = "import sys, slimeish.cli, slimeish.cluster, slimeish.train.loop; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
