"""The local provider: isolation under bubblewrap, and a timeout that kills the whole process group."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
from pathlib import Path

import pytest

from slimeish.rollout_functions.harness.local import LocalProvider, LocalSandbox
from slimeish.rollout_functions.harness.tasks import load_task

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)


def processes_running(marker: str) -> list[int]:
    """Live processes (zombies have no cmdline) whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # it ended while we looked
                pass
    return found


async def sandbox(make_task, tmp_path, bwrap: str, **task) -> LocalSandbox:
    provider = LocalProvider(tmp_path / "sandboxes", bwrap)  # type: ignore[arg-type]
    created = await provider.create(load_task(make_task(**task)))
    assert isinstance(created, LocalSandbox)
    return created


@pytest.mark.parametrize("bwrap", [pytest.param("on", marks=needs_bwrap), "off"])
def test_a_timeout_kills_the_whole_process_group(make_task, tmp_path, bwrap):
    marker = str(random.randrange(10**8, 10**9))  # a sleep no other process runs

    async def scenario():
        box = await sandbox(make_task, tmp_path, bwrap, name=f"timeout-{bwrap}")
        # a background child, and its own child, outlive the shell unless the group is killed
        command = f"(sleep {marker} &) ; sleep {marker} & echo started; wait"
        result = await box.exec(command, env={}, timeout_s=1.0)
        await box.destroy()
        return result

    result = asyncio.run(scenario())
    assert result.timed_out and "started" in result.output
    assert processes_running(f"sleep\0{marker}") == []


@needs_bwrap
def test_an_agent_can_write_only_its_workspace_and_never_sees_another_episode(make_task, tmp_path):
    host_file = Path(os.environ.get("HOME", "/root")) / f".slimeish-harness-probe-{random.randrange(10**9)}"
    outside = tmp_path / "outside.txt"
    outside.write_text("host\n")

    async def scenario():
        first = await sandbox(make_task, tmp_path, "on", name="first", files={"secret.txt": "first's\n"})
        second = await sandbox(make_task, tmp_path, "on", name="second")
        writes = await second.exec(
            f"echo x > {host_file}; echo x > {outside}; echo x > /etc/slimeish-probe; echo mine > /app/mine.txt",
            env={}, timeout_s=30,
        )  # fmt: skip
        peeks = await second.exec(f"cat {first.dir}/app/secret.txt; ls {first.dir.parent}", env={}, timeout_s=30)
        tmp = await second.exec("echo t > /tmp/t && ls /tmp", env={}, timeout_s=30)
        first_tmp = await first.exec("ls /tmp", env={}, timeout_s=30)
        mine = (second.dir / "app" / "mine.txt").read_text()
        await first.destroy()
        await second.destroy()
        return writes, peeks, tmp, first_tmp, mine

    writes, peeks, tmp, first_tmp, mine = asyncio.run(scenario())
    assert writes.exit_code == 0 and mine == "mine\n"  # its workspace is writable
    assert writes.output.count("Read-only file system") + writes.output.count("No such file or directory") == 3
    assert not host_file.exists() and outside.read_text() == "host\n"
    assert not Path("/etc/slimeish-probe").exists()
    assert peeks.exit_code != 0 and "first's" not in peeks.output
    assert tmp.output.split() == ["t"] and first_tmp.output.split() == []  # /tmp is each one's own


def test_a_failing_setup_script_is_a_sandbox_error_and_leaves_nothing(make_task, tmp_path):
    from slimeish.rollout_functions.harness.sandbox import SandboxError

    provider = LocalProvider(tmp_path / "sandboxes", "auto")
    task = load_task(make_task("broken", setup_sh="echo cannot build; exit 7"))
    with pytest.raises(SandboxError, match=r"setup\.sh exited with 7: cannot build"):
        asyncio.run(provider.create(task))
    assert list((tmp_path / "sandboxes").iterdir()) == []
