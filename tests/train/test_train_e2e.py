"""`slimeish train` end to end: real buffer, engine, router and Megatron trainer processes.

Short runs of the token-in rollout on a tiny random model; the reward is a reference plugin.
The buffer is started by the test so it outlives a SIGKILLed trainer, as a remote Redis would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slimeish.buffer import Buffer
from slimeish.common.procs import ManagedProcess
from slimeish.train.metrics import read_metrics

pytestmark = pytest.mark.slow
REWARD = "tests.train.reference_plugins.first_token_parity"


def train_argv(model: Path, prompts: dict[str, Path], run_dir: Path, buffer_url: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "slimeish", "train", "--model-path", str(model), "--run-dir", str(run_dir),
        "--buffer-url", buffer_url, "--prompt-data", str(prompts["train"]),
        "--eval-prompt-data", str(prompts["eval"]), "--custom-rm-path", REWARD,
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8",
        "--lr", "1e-4", *extra,
    ]  # fmt: skip


def run_train(argv: list[str], log: Path, timeout: float = 240) -> None:
    with ManagedProcess(argv, log_path=log) as proc:
        assert proc.proc.wait(timeout) == 0, log.read_text()[-3000:]


def metrics(run_dir: Path) -> list[dict]:
    return read_metrics(run_dir)


def ledger(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "trained_groups.jsonl").read_text().splitlines()]


def trained_count(url: str, run_id: str) -> int:
    async def read() -> int:
        async with Buffer(url, run_id) as buf:
            return (await buf.stats()).groups_trained

    return asyncio.run(read())


def group_states(url: str, run_id: str) -> dict[str, str]:
    async def read() -> dict[str, str]:
        async with Buffer(url, run_id) as buf:
            keys = [key.decode() async for key in buf.redis.scan_iter(match=buf.keys.groups_pattern())]
            return {buf.keys.group_id_from_key(k): (await buf.redis.hget(k, "state")).decode() for k in keys}

    return asyncio.run(read())


def test_sync_run_is_on_policy_and_trains_each_group_once(tiny_model, prompts, valkey, tmp_path):
    run_dir = tmp_path / "sync"
    argv = train_argv(tiny_model, prompts, run_dir, valkey.url, "--num-rollout", "3", "--eval-interval", "2")
    run_train(argv, tmp_path / "sync.log")
    rows = metrics(run_dir)
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [0, 1, 2]
    for r in steps:  # every batch was sampled by the weights that train on it
        assert r["train/rollout_logprob_abs_diff_max"] <= 1e-4
        assert r["rollout/staleness_max"] == 0 and r["train/weight_version"] == r["step"] + 1
        assert r["router/turns"] >= 4 and r["router/tool_parse_failures"] >= 0 and r["perf/sampled_tokens_per_s"] > 0
    assert [r["step"] for r in rows if "eval/reward_mean" in r] == [0, 2, 3]
    groups = [g for line in ledger(run_dir) for g in line["groups"]]
    assert len(groups) == 6 and len(set(groups)) == 6
    assert trained_count(valkey.url, "sync") == len(groups)
    assert (run_dir / "reward.png").exists() and (run_dir / "checkpoints" / "latest").exists()


def test_async_run_respects_the_staleness_bound(tiny_model, prompts, valkey, tmp_path):
    run_dir = tmp_path / "async"
    argv = train_argv(tiny_model, prompts, run_dir, valkey.url, "--num-rollout", "4", "--mode", "async",
                      "--max-staleness", "1")  # fmt: skip
    run_train(argv, tmp_path / "async.log")
    steps = [r for r in metrics(run_dir) if "train/loss" in r]
    assert [r["step"] for r in steps] == [0, 1, 2, 3]
    assert all(r["rollout/staleness_max"] <= 1 for r in steps)
    groups = [g for line in ledger(run_dir) for g in line["groups"]]
    assert len(groups) == len(set(groups)) == 8


def test_async_regenerates_stale_members_and_trains_only_current_tokens(tiny_model, prompts, valkey, tmp_path):
    """Staleness 0: the groups generated alongside the first batch are stale once it is trained;
    their members are generated again under the same group ids, so every trained token comes
    from the trainer's current weights."""
    run_dir = tmp_path / "async-k0"
    argv = train_argv(tiny_model, prompts, run_dir, valkey.url, "--num-rollout", "3", "--mode", "async",
                      "--max-staleness", "0")  # fmt: skip
    run_train(argv, tmp_path / "async-k0.log")
    steps = [r for r in metrics(run_dir) if "train/loss" in r]
    assert len(steps) == 3
    assert all(r["rollout/staleness_max"] == 0 and r["train/rollout_logprob_abs_diff_max"] <= 1e-4 for r in steps)
    assert sum(r["buffer/members_regenerated"] for r in steps) >= 2
    assert sum(r["buffer/groups_reopened"] for r in steps) >= 1
    groups = [g for line in ledger(run_dir) for g in line["groups"]]
    assert len(groups) == len(set(groups)) == 6


def test_resume_after_sigkill_loses_no_group_and_trains_none_twice(tiny_model, prompts, valkey, tmp_path):
    run_dir = tmp_path / "resume"
    argv = train_argv(tiny_model, prompts, run_dir, valkey.url, "--num-rollout", "8", "--save-interval", "2",
                      "--custom-rm-path", "tests.train.reference_plugins.slow_from_group_6")  # fmt: skip
    with ManagedProcess(argv, log_path=tmp_path / "first.log") as first:
        deadline = time.monotonic() + 240
        # Killed after steps 0-2, while step 3's sessions (groups 6 and 7, scored slowly) are open.
        while len(metrics(run_dir)) < 3 or "g6" not in group_states(valkey.url, "resume"):
            assert time.monotonic() < deadline and first.proc.poll() is None, (tmp_path / "first.log").read_text()
            time.sleep(0.2)
        assert group_states(valkey.url, "resume")["g6"] == "open"
        first.kill(signal.SIGKILL)
        first.proc.wait()
    killed = ledger(run_dir)
    checkpoint = json.loads((run_dir / "checkpoints" / "latest" / "trainer_state.json").read_text())
    resumed_from = checkpoint["data_state"]["rollout_step"]
    assert resumed_from in (2, 4)
    lost_training = {g for line in killed if line["step"] >= resumed_from for g in line["groups"]}
    drawn_before_resume = json.loads((run_dir / "data_state.json").read_text())["next_group_index"]

    run_train([*argv, "--load", str(run_dir / "checkpoints" / "latest")], tmp_path / "second.log")
    final = ledger(run_dir)
    # Steps that train only groups drawn after the resume were sampled by the resumed weights.
    fresh = {line["step"] for line in final if all(int(g[1:]) >= drawn_before_resume for g in line["groups"])}
    assert fresh, "the resumed run trained no freshly generated batch"
    for r in metrics(run_dir):
        if r.get("step") in fresh and "train/loss" in r:
            assert r["train/rollout_logprob_abs_diff_max"] <= 1e-4, r
    assert [line["step"] for line in final] == list(range(8))
    groups = [g for line in final for g in line["groups"]]
    assert len(groups) == len(set(groups)), "a group was trained twice"
    assert lost_training <= set(groups), "groups trained after the last checkpoint were not re-trained"
    assert trained_count(valkey.url, "resume") == len(groups)
    # Groups the killed run was still generating were finished after the resume, and trained.
    before = {g: state for g, state in group_states(valkey.url, "resume").items() if int(g[1:]) < drawn_before_resume}
    assert "g6" in before and all(state == "trained" for state in before.values()), before


def descendants(pid: int) -> set[int]:
    """Every process below `pid`, from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # exited while we read
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@contextlib.contextmanager
def sigint_not_ignored() -> Iterator[None]:
    """Children started inside get SIGINT at its default, as a run started from a terminal has it.
    A child inherits an ignored SIGINT, and pytest started in the background (`nohup ... &`, some
    CI runners) has it ignored: Ctrl-C could then never reach the run, whatever slimeish does."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_every_child_process(tiny_model, prompts, valkey, tmp_path):
    """Ctrl-C (SIGINT to the train process's group; its children run in sessions of their own, so it
    never reaches them) stops the buffer, engine and router it started, and the run exits."""
    # More steps than can finish before the signal (~10 steps/s here), so an ignored one cannot pass.
    argv = train_argv(tiny_model, prompts, tmp_path / "interrupted", valkey.url, "--num-rollout", "100000")
    at = argv.index("--buffer-url")
    del argv[at : at + 2]  # its own embedded buffer: one more child to stop
    with sigint_not_ignored():
        train = ManagedProcess(argv, log_path=tmp_path / "interrupted.log")
    with train:
        deadline = time.monotonic() + 240
        while not metrics(tmp_path / "interrupted"):
            assert time.monotonic() < deadline and train.proc.poll() is None, (tmp_path / "interrupted.log").read_text()
            time.sleep(0.2)
        children = descendants(train.pid)
        assert len(children) >= 3, children  # buffer, engine, router (and their helpers)
        train.kill(signal.SIGINT)
        assert train.proc.wait(60) == 0
    deadline = time.monotonic() + 10  # orphans are reaped by init a moment later
    while any(map(running, children)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if running(pid)]
    assert "interrupted: stopping every child process" in (tmp_path / "interrupted.log").read_text()


def test_sync_stays_on_policy_when_groups_are_dropped(tiny_model, prompts, valkey, tmp_path):
    """Dropped groups are replaced by generating just the missing ones: no surplus group is left
    over to be trained a version later."""
    run_dir = tmp_path / "sync-drops"
    argv = train_argv(tiny_model, prompts, run_dir, valkey.url, "--num-rollout", "4", "--rollout-batch-size", "4",
                      "--custom-rm-path", "tests.train.reference_plugins.fail_every_fourth_group")  # fmt: skip
    run_train(argv, tmp_path / "sync-drops.log", timeout=180)
    steps = [r for r in metrics(run_dir) if "train/loss" in r]
    assert len(steps) == 4
    assert all(r["rollout/staleness_max"] == 0 and r["train/rollout_logprob_abs_diff_max"] <= 1e-4 for r in steps)


def test_async_keeps_producing_when_groups_are_dropped(tiny_model, prompts, valkey, tmp_path):
    run_dir = tmp_path / "drops"
    argv = train_argv(tiny_model, prompts, run_dir, valkey.url, "--num-rollout", "3", "--mode", "async",
                      "--custom-rm-path", "tests.train.reference_plugins.fail_odd_groups")  # fmt: skip
    run_train(argv, tmp_path / "drops.log", timeout=180)
    groups = [g for line in ledger(run_dir) for g in line["groups"]]
    assert len(groups) == 6 and all(int(g[1:]) % 2 == 0 for g in groups)  # only complete groups trained


def test_missing_reward_fails_the_run_with_a_clear_error(tiny_model, prompts, valkey, tmp_path):
    argv = train_argv(tiny_model, prompts, tmp_path / "none", valkey.url, "--num-rollout", "2",
                      "--custom-rm-path", "tests.train.reference_plugins.no_reward")  # fmt: skip
    log = tmp_path / "none.log"
    with ManagedProcess(argv, log_path=log) as proc:
        assert proc.proc.wait(180) != 0
    assert "gave no trainable group" in log.read_text()


def test_wrong_plugin_fails_before_any_process_starts(tiny_model, prompts, valkey, tmp_path):
    argv = train_argv(tiny_model, prompts, tmp_path / "bad", valkey.url,
                      "--custom-rm-path", "tests.train.reference_plugins.not_async_reward")  # fmt: skip
    log = tmp_path / "bad.log"
    with ManagedProcess(argv, log_path=log) as proc:
        assert proc.proc.wait(60) != 0
    text = log.read_text()
    assert "async def reward(args, sample: Sample) -> float" in text
    assert not (tmp_path / "bad" / "logs").exists()  # no engine, router or buffer was started
