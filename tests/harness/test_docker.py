"""The docker provider against a real dockerd (the session's own) and real containers: what a command
sees and may write, copying in and out, a container lost from outside, and the base image made
offline. Timeouts, memory and the network are test_sandbox.py's tests, run over every provider."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import aiodocker
import pytest

from slimeish.rollout_functions.harness.docker import API_VERSION, PROJECT, DockerProvider, DockerSandbox
from slimeish.rollout_functions.harness.docker_image import image_archive
from slimeish.rollout_functions.harness.sandbox import SandboxError
from slimeish.rollout_functions.harness.tasks import load_task
from tests.harness.conftest import needs_docker

pytestmark = needs_docker


async def container(provider: DockerProvider, make_task, **task) -> DockerSandbox:
    created = await provider.create(load_task(make_task(**task)))
    assert isinstance(created, DockerSandbox)
    return created


def test_a_command_runs_in_app_with_only_the_given_environment_and_files_copy_both_ways(
    make_task, tmp_path, docker_daemon, monkeypatch
):
    monkeypatch.setenv("SLIMEISH_HOST_SECRET", "host-only")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "new.txt").write_text("uploaded\n")

    async def scenario():
        box = await container(DockerProvider(url=docker_daemon), make_task, name="env", files={"old.txt": "x\n"})
        env = await box.exec("pwd; env; bash --version | head -1; python3 -V", env={"GIVEN": "yes"}, timeout_s=60)
        await box.upload(tmp_path / "in", "/app")  # replaces /app's contents
        await box.exec("echo made > made.txt", env={}, timeout_s=60)
        await box.download("/app", tmp_path / "out")
        await box.destroy()
        await box.destroy()  # twice is fine
        return env

    env = asyncio.run(scenario())
    seen = dict(line.split("=", 1) for line in env.output.splitlines() if "=" in line)
    assert env.exit_code == 0 and env.output.startswith("/app\n") and "GNU bash" in env.output
    assert "Python 3" in env.output
    assert "SLIMEISH_HOST_SECRET" not in seen and seen["GIVEN"] == "yes"
    assert (seen["APP_DIR"], seen["TESTS_DIR"], seen["LOGS_DIR"], seen["HOME"]) == ("/app", "/tests", "/logs", "/tmp")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["made.txt", "new.txt"]
    assert (tmp_path / "out" / "new.txt").read_text() == "uploaded\n"


def test_a_container_can_write_only_itself_and_never_sees_another(make_task, tmp_path, docker_daemon):
    host_file = Path(os.environ.get("HOME", "/root")) / f".slimeish-docker-probe-{random.randrange(10**9)}"
    outside = PROJECT / "README.md"
    before = outside.read_bytes()

    async def scenario():
        provider = DockerProvider(url=docker_daemon)
        first, second = await asyncio.gather(
            container(provider, make_task, name="first", files={"secret.txt": "first's\n"}),
            container(provider, make_task, name="second"),
        )
        writes = await second.exec(
            f"echo x > {host_file}; echo x > {outside}; echo x > /etc/slimeish-probe; echo x > /usr/probe; "
            "echo mine > /app/mine.txt; cat /app/mine.txt",
            env={}, timeout_s=60,
        )  # fmt: skip
        # the first's file is nowhere in the second: not at its path, not anywhere in its own filesystem
        # (-xdev: the container's layer, not the host's read-only directories)
        peeks = await second.exec("cat /app/secret.txt; find / -xdev -name secret.txt", env={}, timeout_s=120)
        firsts = await first.exec("ls /app", env={}, timeout_s=60)
        await asyncio.gather(first.destroy(), second.destroy())
        return writes, peeks, firsts

    writes, peeks, firsts = asyncio.run(scenario())
    # its workspace is writable (stdout and stderr are two streams: their lines interleave either way)
    assert "mine" in writes.output.splitlines(), writes.output
    # /etc, /usr and the checkout are the host's, read-only; /root is not the host's at all
    assert writes.output.count("Read-only file system") == 3, writes.output
    assert not host_file.exists() and outside.read_bytes() == before and not Path("/etc/slimeish-probe").exists()
    assert peeks.output.splitlines() == ["cat: /app/secret.txt: No such file or directory"]
    assert firsts.output.split() == ["secret.txt"]  # nor does the second's file reach the first


def test_a_container_removed_while_a_command_runs_is_a_sandbox_error(make_task, docker_daemon):
    async def scenario():
        box = await container(DockerProvider(url=docker_daemon), make_task, name="lost")
        running = asyncio.ensure_future(box.exec("sleep 600", env={}, timeout_s=300))
        await asyncio.sleep(1)
        async with aiodocker.Docker(docker_daemon, api_version=API_VERSION) as docker:
            await docker.containers.container(box.id).delete(force=True)
        with pytest.raises(SandboxError, match=r"was removed|stopped"):
            await running
        with pytest.raises(SandboxError):  # and so is anything asked of it after
            await box.exec("true", env={}, timeout_s=60)
        await box.destroy()  # gone already: still fine

    asyncio.run(scenario())


def test_the_base_image_is_made_from_the_projects_files_alone_the_same_each_time():
    tag, archive = image_archive()
    assert image_archive() == (tag, archive)  # same bytes, same tag: reproducible from a fresh clone
    assert tag.startswith("slimeish-sandbox:") and len(archive) < 64 * 1024


def test_a_task_that_asks_for_the_internet_is_refused(make_task, docker_daemon):
    task_dir = make_task("online")
    (task_dir / "task.toml").write_text('[environment]\nnetwork_mode = "public"\n')
    with pytest.raises(SandboxError, match="internet"):
        asyncio.run(DockerProvider(url=docker_daemon).create(load_task(task_dir)))
