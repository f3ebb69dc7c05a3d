"""`collecting`: a child's exit seen apart from its output, under asyncio's loop and uvloop (Ray's)."""

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
import uvloop

from slimeish.common.child_output import Output, collecting, note_cut

LOOPS = {"asyncio": None, "uvloop": uvloop.new_event_loop}


def run(loop: str, coroutine):
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(asyncio.wait_for(coroutine, 60))  # a regression fails, it does not hang


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def gone(pid: int) -> bool:
    """Whether process `pid` ended (a zombie has), waiting up to a minute."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("loop", LOOPS)
def test_the_exit_comes_at_once_and_output_a_process_outside_the_group_holds_is_cut(loop, tmp_path):
    """A daemon in a session of its own holds stdout for 10 minutes: the exit is seen at once, what
    was written comes after the drain, marked as cut; closing the pipes ends the daemon (SIGPIPE)."""
    pid_file = tmp_path / "pid"

    async def scenario():
        argv = ["sh", "-c", f"setsid sh -c 'while :; do sleep 0.1; echo more; done' & echo $! > {pid_file}; "
                "echo out; echo err >&2; exit 4"]  # fmt: skip
        async with collecting(argv) as child:
            return await child.wait(), await child.output(drain_s=0.5)

    code, output = run(loop, scenario())
    daemon = int(pid_file.read_text())
    if not gone(daemon):
        os.kill(daemon, signal.SIGKILL)
        pytest.fail("the daemon outlived its closed output")
    assert (code, output.stderr, output.cut) == (4, b"err\n", True)
    first, *later = output.stdout.splitlines()
    assert first == b"out" and set(later) <= {b"more"}
    assert (
        note_cut(b"out")
        == note_cut(b"out\n")
        == b"out\n(output cut: a process the command left running still holds it)\n"
    )


@pytest.mark.parametrize("loop", LOOPS)
def test_merged_output_keeps_its_order_and_its_last_bytes(loop):
    """`> /dev/stdout` opens the pipe anew (a socket, uvloop's own kind, cannot be; a file would be truncated)."""

    async def merged(command: str, keep: int | None = None) -> Output:
        async with collecting(["sh", "-c", command], merge_stderr=True, keep=keep) as child:
            return await child.output()

    assert run(loop, merged("echo a; echo b >&2; echo c > /dev/stdout; cat")) == Output(b"a\nb\nc\n", b"", False)
    assert run(loop, merged("head -c 5000 /dev/zero | tr '\\0' x", keep=100)) == Output(b"x" * 100, b"", False)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_program_that_cannot_start_is_an_error_and_leaves_no_descriptor(loop):
    async def scenario():
        async with collecting(["/nonexistent/program"]):
            pass

    before = open_fds()
    with pytest.raises(FileNotFoundError):
        run(loop, scenario())
    assert open_fds() == before


@pytest.mark.parametrize("loop", LOOPS)
def test_a_block_cancelled_while_the_child_runs_kills_and_reaps_it_and_closes_the_pipes(loop):
    async def scenario():
        started = asyncio.get_running_loop().create_future()

        async def child_of_the_block():
            async with collecting(["sleep", "600"]) as child:
                started.set_result(child.pid)
                await child.wait()

        task = asyncio.ensure_future(child_of_the_block())
        pid = await started
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return pid

    before = open_fds()
    pid = run(loop, scenario())
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped before the block was left
    assert open_fds() == before
