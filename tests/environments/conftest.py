"""Fixtures of the environment-adapter runs: a real engine behind a recording proxy (the test's own
view of what the engine received and sampled), a real Redis-protocol buffer, and `slimeish train`
run against both for a few steps with one adapter."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.common.procs import ManagedProcess
from slimeish.common.sample import Sample
from slimeish.train.metrics import read_metrics
from tests.router.conftest import recording_proxy, start_engine
from tests.router.test_openai_sdk import assert_exact_capture
from tests.stand_in import serve_app


@dataclass
class Stack:
    engine_url: str  # the recording proxy in front of the engine
    buffer_url: str
    engine_log: list  # (request, response) of every /generate the engine answered


@pytest.fixture(scope="module")
def stack(tiny_model, tmp_path_factory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("env-stack")
    proc, engine = start_engine(tiny_model, logs)
    log: list = []
    try:
        with (
            EmbeddedServer(logs / "valkey") as valkey,
            serve_app(recording_proxy(engine, log), startup_timeout=30) as proxy,
        ):
            yield Stack(proxy, valkey.url, log)
    finally:
        proc.stop()


def run_train(stack: Stack, model: Path, run_dir: Path, rollout_path: str, *extra: str, timeout: float = 600) -> None:
    """`slimeish train` for 3 steps with the adapter at `rollout_path` against the stack's engine and buffer."""
    argv = [
        sys.executable, "-m", "slimeish", "train", "--model-path", str(model), "--run-dir", str(run_dir),
        "--buffer-url", stack.buffer_url, "--engine-url", stack.engine_url, "--rollout-function-path", rollout_path,
        "--num-rollout", "3", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--lr", "1e-4",
        "--rollout-max-response-len", "12", *extra,
    ]  # fmt: skip
    log = run_dir.parent / f"{run_dir.name}.log"
    with ManagedProcess(argv, log_path=log) as proc:
        assert proc.proc.wait(timeout) == 0, log.read_text()[-4000:]


def stored_samples(buffer_url: str, run_id: str) -> list[Sample]:
    async def read() -> list[Sample]:
        async with Buffer(buffer_url, run_id) as buf:
            return [s async for s in buf.iter_samples()]

    return asyncio.run(read())


def finish_scores(buffer_url: str, run_id: str, session_ids: list[str]) -> list[dict]:
    """The named scores each session was finished with (its finish metadata's `scores`)."""

    async def read() -> list[dict]:
        async with Buffer(buffer_url, run_id) as buf:
            views = await buf.sessions(session_ids)
            return [views[sid].finish_metadata.get("scores", {}) for sid in session_ids]

    return asyncio.run(read())


def engine_calls(sample: Sample, log: list) -> list:
    """The engine's (request, response) pairs whose prompt and sampled tokens lie along `sample`'s
    tokens, by prompt length (equal turns of two members, e.g. greedy eval, count once)."""
    calls = {}
    for request, response in log:
        ids, out = request["input_ids"], response["output_ids"]
        if sample.tokens[: len(ids)] == ids and sample.tokens[len(ids) : len(ids) + len(out)] == out:
            calls.setdefault(len(ids), (request, response))
    return [calls[k] for k in sorted(calls)]


def check_run(stack: Stack, run_dir: Path, scores: set[str] = frozenset()) -> list[Sample]:
    """Three trained steps on the weights that sampled them; every stored sample is one unsplit
    episode whose tokens, mask and log-probs are exactly what the engine received and sampled,
    finished with the environment's named `scores` beside its reward."""
    steps = [r for r in read_metrics(run_dir) if "train/loss" in r]
    assert [r["step"] for r in steps] == [0, 1, 2]
    assert all(r["train/rollout_logprob_abs_diff_max"] <= 1e-4 for r in steps)
    samples = stored_samples(stack.buffer_url, run_dir.name)
    assert len(samples) >= 12  # 3 steps x 2 groups x 2 members
    for sample in samples:
        assert sample.segment_index == 0 and sample.split_reason is None  # no split inside an episode
        calls = engine_calls(sample, stack.engine_log)
        assert calls, "every stored turn was sampled by the engine"
        assert_exact_capture(sample, calls, None)
    for named in finish_scores(stack.buffer_url, run_dir.name, [s.session_id for s in samples]):
        assert scores <= set(named), named
    return samples
