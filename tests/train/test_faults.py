"""A run heals itself: each part of a real `slimeish train` run is broken mid-run, and the run
reaches its last step with no manual step, no group lost and none trained twice.

Every run here starts its own buffer server, engines and router (so the run's supervisor owns
them); the test finds each part's pid in the run dir's `parts.json`. Recovery times are printed
(`pytest -s`); docs/benchmarks.md reports the chaos bench, which kills parts for ten minutes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slimeish.buffer import EmbeddedServer
from slimeish.common.procs import ManagedProcess
from tests.router.conftest import start_engine
from tests.train.test_train_e2e import descendants, group_states, ledger, metrics, trained_count

pytestmark = pytest.mark.slow
STEPS = 10


def fault_argv(model: Path, prompts: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "slimeish", "train", "--model-path", str(model), "--run-dir", str(run_dir),
        "--prompt-data", str(prompts["train"]), "--custom-rm-path", "tests.train.reference_plugins.half_second",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8",
        "--num-rollout", str(STEPS), "--save-interval", "3", *extra,
    ]  # fmt: skip


def wait_for(condition: Callable[[], bool], what: str, proc: ManagedProcess, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.proc.poll() is None, f"the run exited while waiting for {what}: {proc.log_path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def part_pid(run_dir: Path, name: str) -> int:
    return json.loads((run_dir / "parts.json").read_text())[name]["pid"]


def check_exactly_once(run_dir: Path, steps: int = STEPS) -> list[str]:
    """Every step trained once, no group twice, and the buffer agrees: its trained groups are the
    ledger's, and no finished trainable group was left untrained (2 groups a step)."""
    final = ledger(run_dir)
    assert [line["step"] for line in final] == list(range(steps))
    groups = [g for line in final for g in line["groups"]]
    assert len(groups) == len(set(groups)) == 2 * steps, "a group was trained twice"
    assert [r["step"] for r in metrics(run_dir) if "train/loss" in r] == list(range(steps))
    with EmbeddedServer(run_dir / "buffer") as server:
        run_id = run_dir.name
        assert trained_count(server.url, run_id) == len(groups)
        states = group_states(server.url, run_id)
    assert {g for g, s in states.items() if s == "trained"} == set(groups)
    assert not [g for g, s in states.items() if s == "ready"], states  # finished, never trained: lost
    return groups


def recovery_times(log: Path) -> list[float]:
    times = [float(t) for t in re.findall(r"is back, ([\d.]+) s after it died", log.read_text())]
    print(f"\n{log.stem}: recovered in {times} s")
    return times


@pytest.mark.parametrize("part", ["engine1", "router", "buffer"])
def test_a_killed_part_is_restarted_and_the_run_finishes(tiny_model, prompts, tmp_path, part):
    run_dir = tmp_path / f"kill-{part}"
    argv = fault_argv(tiny_model, prompts, run_dir, "--num-engines", "2")
    with ManagedProcess(argv, log_path=tmp_path / f"{part}.log") as run:
        wait_for(lambda: len(metrics(run_dir)) >= 2, "two steps", run)
        buffer_url = json.loads((run_dir / "parts.json").read_text())["buffer"]["url"]
        wait_for(lambda: "open" in group_states(buffer_url, run_dir.name).values(), "open sessions", run, 60)
        os.kill(part_pid(run_dir, part), signal.SIGKILL)
        assert run.proc.wait(600) == 0, run.log_path.read_text()[-3000:]
    assert recovery_times(run.log_path), f"{part} was never restarted"
    check_exactly_once(run_dir)


def test_a_stalled_buffer_holds_the_run_only_while_it_is_stopped(tiny_model, prompts, tmp_path):
    run_dir = tmp_path / "stall"
    with ManagedProcess(fault_argv(tiny_model, prompts, run_dir), log_path=tmp_path / "stall.log") as run:
        wait_for(lambda: len(metrics(run_dir)) >= 2, "two steps", run)
        (valkey,) = descendants(part_pid(run_dir, "buffer"))  # the server itself, under `buffer serve`
        os.kill(valkey, signal.SIGSTOP)
        time.sleep(5)
        os.kill(valkey, signal.SIGCONT)
        assert run.proc.wait(600) == 0, run.log_path.read_text()[-3000:]
    check_exactly_once(run_dir)


def test_a_killed_trainer_resumes_when_the_same_command_runs_again(tiny_model, prompts, tmp_path):
    run_dir = tmp_path / "trainer"
    argv = fault_argv(tiny_model, prompts, run_dir)
    with ManagedProcess(argv, log_path=tmp_path / "first.log") as first:
        wait_for(lambda: (run_dir / "checkpoints" / "latest").exists() and len(metrics(run_dir)) >= 4, "a save", first)
        first.kill(signal.SIGKILL)
        killed_at = time.monotonic()
        first.proc.wait()
    with ManagedProcess(argv, log_path=tmp_path / "second.log") as second:  # the very same command
        wait_for(lambda: "resuming from" in second.log_path.read_text(), "the resume", second)
        print(f"\ntrainer: resumed {time.monotonic() - killed_at:.1f} s after the kill")
        assert second.proc.wait(600) == 0, second.log_path.read_text()[-3000:]
    check_exactly_once(run_dir)


def test_a_part_that_keeps_dying_is_given_up_and_the_run_stops_only_without_it(tiny_model, prompts, tmp_path):
    """With no restarts allowed: an engine that dies is given up while another serves, and the
    run goes on; the router dying then stops the run with one line naming it."""
    run_dir = tmp_path / "give-up"
    argv = fault_argv(tiny_model, prompts, run_dir, "--num-engines", "2", "--max-restarts", "0")
    argv[argv.index("--num-rollout") + 1] = "100000"
    with ManagedProcess(argv, log_path=tmp_path / "give-up.log") as run:
        wait_for(lambda: len(metrics(run_dir)) >= 1, "a step", run)
        os.kill(part_pid(run_dir, "engine1"), signal.SIGKILL)
        steps = len(metrics(run_dir))
        wait_for(lambda: len(metrics(run_dir)) >= steps + 3, "steps on the other engine", run)
        assert "engine1 died 1 time within 600 s" in run.log_path.read_text()
        os.kill(part_pid(run_dir, "router"), signal.SIGKILL)
        assert run.proc.wait(120) == 1
    log = run.log_path.read_text()
    assert "giving it up, the run goes on with 1 engine(s)" in log
    assert "RuntimeError: router died 1 time within 600 s (last exit code -9)" in log


def test_an_outside_engine_that_stays_down_stops_the_run_with_one_line_naming_it(tiny_model, prompts, tmp_path):
    """An engine given by --engine-url is nobody's to restart: once it failed its health checks for
    --engine-down-timeout, the run's last line says that no engine is up, and which."""
    engine, url = start_engine(tiny_model, tmp_path)
    run_dir = tmp_path / "outside"
    argv = fault_argv(tiny_model, prompts, run_dir, "--engine-url", url, "--engine-down-timeout", "5")
    argv[argv.index("--num-rollout") + 1] = "100000"
    try:
        with ManagedProcess(argv, log_path=tmp_path / "outside.log") as run:
            wait_for(lambda: len(metrics(run_dir)) >= 1, "a step", run)
            engine.kill(signal.SIGKILL)
            assert run.proc.wait(300) == 1
    finally:
        engine.stop()
    last = run.log_path.read_text().strip().splitlines()[-1]
    assert f"RuntimeError: no engine is up: {url} (down since " in last, last  # torch prefixes "[rank0]: "
    assert "--engine-down-timeout 5" in last
