"""`slimeish train --num-routers 2`: two routers share the engines and the buffer. Sessions are
spread over both, capture stays exact (the trainer's log-probs are the engines'), and a
SIGKILLed router is restarted and regenerates only its own sessions: no group lost, none trained
twice. (That each engine takes each weight update once: tests/router/test_router_replicas.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter

import pytest

from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.common.procs import ManagedProcess
from tests.train.test_faults import check_exactly_once, fault_argv, part_pid, recovery_times, wait_for
from tests.train.test_train_e2e import metrics

pytestmark = pytest.mark.slow


def sessions_by_owner(url: str, run_id: str) -> dict[str, Counter[str]]:
    """status -> {router id: sessions}, for every session of the run."""

    async def read() -> dict[str, Counter[str]]:
        async with Buffer(url, run_id) as buf:
            out: dict[str, Counter[str]] = {}
            async for key in buf.redis.scan_iter(match=buf.keys.session("*")):
                status, owner = await buf.redis.hmget(key, ["status", "owner"])
                if status is not None:  # the session hash, not one of its turn or sample keys
                    out.setdefault(status.decode(), Counter())[(owner or b"").decode()] += 1
            return out

    return asyncio.run(read())


def test_two_routers_share_a_run_and_a_killed_one_regenerates_only_its_sessions(tiny_model, prompts, tmp_path):
    run_dir = tmp_path / "replicas"
    argv = fault_argv(tiny_model, prompts, run_dir, "--num-engines", "2", "--num-routers", "2")
    with ManagedProcess(argv, log_path=tmp_path / "run.log") as run:
        wait_for(lambda: len(metrics(run_dir)) >= 2, "two steps", run)
        parts = json.loads((run_dir / "parts.json").read_text())
        assert [name for name, p in parts.items() if p["role"] == "router"] == ["router0", "router1"]
        buffer_url = parts["buffer"]["url"]
        pending = lambda: sessions_by_owner(buffer_url, run_dir.name).get("pending", Counter())  # noqa: E731
        wait_for(lambda: pending()["router1"] > 0, "a session open on router1", run, 60)
        os.kill(part_pid(run_dir, "router1"), signal.SIGKILL)
        assert run.proc.wait(600) == 0, run.log_path.read_text()[-3000:]
    assert recovery_times(run.log_path), "router1 was never restarted"
    check_exactly_once(run_dir)
    steps = [r for r in metrics(run_dir) if "train/loss" in r]
    assert all(r["train/rollout_logprob_abs_diff_max"] <= 1e-4 for r in steps)  # exact capture on both routers
    with EmbeddedServer(run_dir / "buffer") as server:
        owners = sessions_by_owner(server.url, run_dir.name)
    finished = sum((n for status, n in owners.items() if status not in ("aborted", "pending")), Counter())
    assert finished["router0"] > 0 and finished["router1"] > 0, owners  # sessions were spread over both
    assert owners["aborted"]["router1"] > 0, owners  # it held sessions when it was killed
    assert set(owners.get("aborted", {})) <= {"router1"}, owners  # only the killed router's were closed
