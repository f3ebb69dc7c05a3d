"""Agent episodes/s with `--agent-workers ray` on 1 vs 2 simulated nodes, against a stand-in engine.

The stand-in `/generate` server of bench/router_overhead.py answers at once (no model); a real
slimeish router (no buffer: it keeps sessions in memory) sits in front of it. Each episode is an
`agent_command` episode run as `slimeish.rollout_functions.agent_command` runs it under
`run_groups`: the driver opens the session, a Ray task runs the command (this file with `--agent`:
`--turns` chat turns over stdlib HTTP, each followed by `--think-ms` of tool time), the driver
finishes the session. A simulated node (`ray.cluster_utils.Cluster`) offers `--node-cpus` slots
of the custom resource `agents`, one per running episode; the head offers none. Both node counts
run in this one process, on the same stand-in and router; the load generator's CPU per episode is
printed beside each rate. Run by hand:

    .venv/bin/python bench/agent_workers.py --episodes 64 --turns 4 --think-ms 200

The simulated nodes share this machine's cores: with think time the episodes wait more than they
compute, which is what more nodes buy (more episodes at once); without it, the ratio shows the
cores' limit instead.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))  # router_overhead's stand-in, beside this file

from router_overhead import Stack, standin_reply

from slimeish.common.sample import Sample
from slimeish.rollout import RolloutConfig


def agent(turns: int, think_ms: float) -> None:
    """The episode's command: `turns` chat turns on its session, each followed by the tool's time."""
    url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}", "Content-Type": "application/json"}
    messages = [{"role": "user", "content": "hello"}]
    for _ in range(turns):
        body = json.dumps({"model": "m", "messages": messages, "max_tokens": 8}).encode()
        with urllib.request.urlopen(urllib.request.Request(url, body, headers)) as r:
            reply = json.loads(r.read())["choices"][0]["message"]["content"]
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "go on"}]
        time.sleep(think_ms / 1000)
    print(json.dumps({"reward": 1.0}))


def rollout_args(router: str, args: argparse.Namespace, address: str) -> SimpleNamespace:
    command = f"{shlex.quote(sys.executable)} {shlex.quote(__file__)} --agent --turns {args.turns}"
    command += f" --think-ms {args.think_ms}"
    fields = vars(RolloutConfig()) | {"router_url": router, "admin_token": None, "rollout_concurrency": 1024}
    fields |= {"rollout_timeout": 600.0, "n_samples_per_prompt": args.episodes, "rollout_batch_size": 1}
    fields |= {"agent_command": command, "verifier_command": None, "agent_workers": "ray", "agent_num_cpus": 1.0}
    fields |= {"agent_resources": {"agents": 1}, "agent_runtime_env": {}, "ray_address": address}
    return SimpleNamespace(**fields)


class _OneGroup:
    def __init__(self, n: int):
        self.n = n

    def get_samples(self, _: int) -> list[list[Sample]]:
        return [[Sample(group_index=0, index=i, prompt="hello", label=None) for i in range(self.n)]]


def episodes_per_s(router: str, args: argparse.Namespace, nodes: int) -> dict[str, float]:
    """One rollout of `--episodes` episodes on a fresh cluster of `nodes` agent nodes (after a warm-up)."""
    import ray
    from ray.cluster_utils import Cluster

    from slimeish.rollout_functions import agent_workers
    from slimeish.rollout_functions.agent_command import generate_rollout

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(nodes):
        cluster.add_node(num_cpus=args.node_cpus, resources={"agents": args.node_cpus})  # one CPU per episode
    cluster.wait_for_nodes()
    try:
        ra = rollout_args(router, args, cluster.address)
        warm = nodes * args.node_cpus  # every slot's worker process started before the clock runs
        generate_rollout(SimpleNamespace(**(vars(ra) | {"n_samples_per_prompt": warm})), 0, _OneGroup(warm))
        cpu, start = time.process_time(), time.monotonic()
        out = generate_rollout(ra, 0, _OneGroup(args.episodes))
        wall, cpu = time.monotonic() - start, time.process_time() - cpu
    finally:
        ray.shutdown()
        agent_workers._workers.clear()  # the next cluster gets workers of its own
        cluster.shutdown()
    failed = out.metrics["failed"]
    return {"nodes": nodes, "episodes/s": args.episodes / wall, "driver_cpu_ms/episode": 1000 * cpu / args.episodes,
            "failed": failed}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--episodes", type=int, default=64, help="episodes per measured rollout")
    parser.add_argument("--turns", type=int, default=4, help="chat turns per episode")
    parser.add_argument("--think-ms", type=float, default=200.0, help="tool time after each turn")
    parser.add_argument("--node-cpus", type=int, default=4, help="episodes a simulated node runs at once")
    args = parser.parse_args()
    if args.agent:
        return agent(args.turns, args.think_ms)
    from slimeish.models.tiny import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "tiny")
        stack = Stack(model, Path(tmp), standin_reply(model), smg=False)
        try:
            rows = [episodes_per_s(stack.router, args, nodes) for nodes in (1, 2)]
        finally:
            stack.stop()
    load = os.getloadavg()[0]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {load:.1f}; {args.episodes} "
          f"episodes of {args.turns} turns, {args.think_ms:g} ms think, {args.node_cpus} at once per node")  # fmt: skip
    for row in rows:
        print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    print(f"ratio 2 nodes / 1 node: {rows[1]['episodes/s'] / rows[0]['episodes/s']:.2f}")


if __name__ == "__main__":
    main()
