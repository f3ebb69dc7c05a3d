"""agent_command: reward parsing and the subprocess runner, with real shell commands."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import uvloop

from slimeish.rollout_functions.agent_command import AgentCommandConfig, AgentCommandError, parse_reward, run_command
from slimeish.rollout_functions.agent_workers import workers_of


@pytest.mark.parametrize(
    "stdout, reward",
    [
        ('log\n{"reward": 0.5}\n', 0.5),
        ('{"reward": 1}', 1.0),
        ("no json", None),
        ('{"reward": "1"}', None),
        ('{"reward": true}', None),
        ("", None),
        ("[1]", None),
    ],
)
def test_parse_reward(stdout, reward):
    assert parse_reward(stdout) == reward


def test_command_sees_session_env_and_stdin():
    out = asyncio.run(run_command('echo "$OPENAI_BASE_URL"; cat', {"OPENAI_BASE_URL": "http://x/v1"}, b"in"))
    assert out == "http://x/v1\nin"


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_command_inherits_no_descriptor_but_stdio(loop):
    """Not the guard's lifeline (the watchdog's alone), nor what uvloop (the loop of Ray's workers)
    hands every child: all of the starter's inheritable descriptors."""
    inheritable = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(inheritable, True)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop" else None) as runner:
            # bounded: a regression must fail, not hang
            listed = runner.run(asyncio.wait_for(run_command("ls /proc/$$/fd", {}), GONE_WITHIN_S))
        assert listed.split() == ["0", "1", "2"]
    finally:
        os.close(inheritable)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_writes_to_dev_stdout_and_dev_stderr_keep_what_came_before(loop):
    """Shell scripts write `> /dev/stderr`: that opens the output anew, which a file would truncate."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop" else None) as runner:
        out = runner.run(run_command("echo one; echo two > /dev/stdout; echo three", {}))
        assert out == "one\ntwo\nthree\n"
        with pytest.raises(AgentCommandError, match="exited with 3: a\nb\n"):
            runner.run(run_command("echo a >&2; echo b > /dev/stderr; exit 3", {}))


def test_crash_is_an_error_with_stderr():
    with pytest.raises(AgentCommandError, match="exited with 3: boom"):
        asyncio.run(run_command("echo boom >&2; exit 3", {}))


def test_timeout_kills_the_command():
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(run_command("sleep 30", {}), 0.5))


# Generous: the kill is certain, its timing is the machine's (tests never time).
GONE_WITHIN_S = 60.0
# The command's child notes its pid, then the command waits for it: it would live for 10 minutes.
TREE = "sleep 600 & echo $! > {pid_file}; wait"


def gone(pid: int, within_s: float = GONE_WITHIN_S) -> bool:
    """Whether process `pid` ended (a zombie, ended but not yet reaped by whoever adopted it, has)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.1)
    return False


def noted_pid(pid_file: Path) -> int:
    deadline = time.monotonic() + GONE_WITHIN_S
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the command never started its child"
        time.sleep(0.05)
    return int(pid_file.read_text())


def cancel_once_started(episode: Coroutine[Any, Any, Any], pid_file: Path) -> int:
    """Run `episode` until its command's child noted its pid in `pid_file`, then cancel it (the
    episode's timeout) and see it end cancelled: that child's pid."""

    async def run() -> None:
        task = asyncio.ensure_future(episode)
        await asyncio.to_thread(noted_pid, pid_file)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    return noted_pid(pid_file)


def test_a_cancelled_command_takes_every_process_it_started_with_it(tmp_path):
    pid_file = tmp_path / "pid"
    child = cancel_once_started(run_command(TREE.format(pid_file=pid_file), {}), pid_file)
    assert gone(child), "the command's child outlived the cancelled episode"


# A server the command starts in the background and leaves running, holding the command's stdin
# (a program's child inherits it; a shell's `&` job gets /dev/null) and stdout for 10 minutes.
LEFT_RUNNING = (
    f'{sys.executable} -c \'import subprocess, sys; print(subprocess.Popen(["sleep", "600"]).pid, file=sys.stderr)\' '
    "2> {pid_file}; echo done"
)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_finished_commands_output_comes_back_at_once_and_what_it_left_running_is_killed(tmp_path, loop):
    """Neither the unread input (more than a pipe holds) nor the output the server still holds keeps
    the episode waiting; the server goes when the command ends."""
    pid_file = tmp_path / "pid"
    episode = run_command(LEFT_RUNNING.format(pid_file=pid_file), {}, stdin=b"x" * 1_000_000)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop" else None) as runner:
        assert runner.run(asyncio.wait_for(episode, GONE_WITHIN_S)) == "done\n"
    assert gone(noted_pid(pid_file)), "a process the command left running outlived it"


def test_a_command_reading_stdin_without_input_reads_nothing():
    assert asyncio.run(asyncio.wait_for(run_command("cat; echo done", {}), GONE_WITHIN_S)) == "done\n"


@pytest.mark.parametrize("children_first", [False, True], ids=["runner", "children-then-runner"])
def test_the_commands_of_a_runner_that_dies_die_with_it(tmp_path, children_first):
    """A runner that dies cannot kill the command's group itself: the guard's watchdog does. A Ray
    worker force-killed after its cancellation grace SIGKILLs its direct children first (the
    guard shell among them: `RAY_kill_child_processes_on_worker_exit`), then exits."""
    pid_file = tmp_path / "pid"
    code = (
        "import asyncio; from slimeish.rollout_functions.agent_command import run_command; "
        f"asyncio.run(run_command({TREE.format(pid_file=pid_file)!r}, {{}}))"
    )
    runner = subprocess.Popen([sys.executable, "-c", code])
    try:
        child = noted_pid(pid_file)
        if children_first:
            for pid in direct_children(runner.pid):
                os.kill(pid, signal.SIGKILL)
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait()
        assert gone(child), "the command's child outlived the runner that died"
    finally:
        runner.kill()
        runner.wait()


def direct_children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task").iterdir()
    children = [Path(f"{task}/children").read_text().split() for task in tasks]
    found = [int(c) for ids in children for c in ids]
    assert found, "the runner started no process"
    return found


@pytest.mark.parametrize(
    "flags, error",
    [({"agent_resources": {"agents": "x"}}, "--agent-resources: 'agents' must be a number >= 0, got 'x'"),
     ({"agent_resources": ["agents"]}, r"--agent-resources must be a JSON object, got \['agents'\]"),
     ({"agent_num_cpus": -1.0}, "--agent-num-cpus must be >= 0")],
)  # fmt: skip
def test_agent_worker_flags_are_checked_at_start_up(flags, error):
    with pytest.raises(ValueError, match=error):
        AgentCommandConfig(agent_command="true", agent_workers="ray", **flags).check()


def test_local_agent_workers_need_no_ray():
    assert workers_of(SimpleNamespace(agent_workers="local")) is None
