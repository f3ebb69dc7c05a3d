"""Engine fixtures: real `slimeish engine` processes on loopback, started once and stopped after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from slimeish.common.procs import ManagedProcess, free_port, wait_http


def start_engine(model: Path, log_dir: Path, *extra: str) -> tuple[ManagedProcess, str]:
    port = free_port()
    proc = ManagedProcess.slimeish(
        "engine", "--model", str(model), "--port", str(port), *extra, log_path=log_dir / f"engine-{port}.log"
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", timeout=120, proc=proc.proc)
    except Exception:
        proc.stop()
        raise
    return proc, url


@pytest.fixture(scope="session")
def engine_starter():
    """`start_engine(model, log_dir, *flags) -> (process, url)`; the caller stops the process."""
    return start_engine


@pytest.fixture(scope="session")
def engine_url(tiny_model, tmp_path_factory) -> Iterator[str]:
    """A shared engine serving the default tiny model; tests must not change its weights."""
    proc, url = start_engine(tiny_model, tmp_path_factory.mktemp("engine-logs"))
    try:
        yield url
    finally:
        proc.stop()


@pytest.fixture
def client(engine_url) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=engine_url, timeout=60) as c:
        yield c
