"""Trainer test fixtures: one Megatron initialisation per process, engines on free ports."""

from __future__ import annotations

import os

import pytest

from slimeish.common.procs import ManagedProcess, free_port, wait_http
from slimeish.trainer.distributed import init_distributed


@pytest.fixture(scope="session", autouse=True)
def _megatron_cpu():
    """Megatron's parallel state is process-global: initialise it once (gloo, world of one)."""
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    init_distributed(use_gpu=False)


@pytest.fixture(scope="module")
def engine_factory(tmp_path_factory):
    """Start `slimeish engine --model DIR` on a free port; returns its base URL. Stopped at teardown."""
    procs: list[ManagedProcess] = []

    def start(model_dir) -> str:
        port = free_port()
        log = tmp_path_factory.mktemp("engine") / "engine.log"
        proc = ManagedProcess.slimeish("engine", "--model", str(model_dir), "--port", str(port), log_path=log)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=120, proc=proc.proc)
        return url

    yield start
    for p in procs:
        p.stop()
