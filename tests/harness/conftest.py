"""Fixtures of the harness tests: the example tasks, tasks written per test, the providers (a Docker
daemon of the tests' own, one per session), and a sandbox lost from outside."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import aiodocker
import pytest

from slimeish.rollout_functions.harness.docker import API_VERSION, DockerProvider
from slimeish.rollout_functions.harness.dockerd import own_daemon
from slimeish.rollout_functions.harness.local import LocalProvider
from slimeish.rollout_functions.harness.sandbox import SandboxProvider

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "coding_tasks" / "tasks"

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)
needs_docker = pytest.mark.skipif(
    shutil.which("dockerd") is None or os.geteuid() != 0,
    reason="the docker provider's tests start their own dockerd: as root, apt-get install docker.io",
)
# the providers a test runs over: local with bubblewrap, local without, docker
PROVIDERS = [pytest.param("on", marks=needs_bwrap), "off", pytest.param("docker", marks=needs_docker)]


@pytest.fixture(scope="session")
def docker_daemon(tmp_path_factory) -> Iterator[str]:
    """One dockerd for the whole session, its state in a temporary directory; its `unix://` URL."""
    with own_daemon(tmp_path_factory.mktemp("dockerd")) as url:
        yield url


@pytest.fixture
def provider_of(request, tmp_path) -> Callable[[str], SandboxProvider]:
    """`provider_of(kind)`: "docker", or the local provider with bubblewrap "on" or "off"."""

    def make(kind: str) -> SandboxProvider:
        if kind == "docker":
            return DockerProvider(url=request.getfixturevalue("docker_daemon"))
        assert kind in ("on", "off", "auto"), kind
        return LocalProvider(tmp_path / "sandboxes", kind)  # type: ignore[arg-type]

    return make


@pytest.fixture
def make_task(tmp_path):
    """Write a minimal task: `make_task(name, test_sh=..., setup_sh=..., files={...}, agent_timeout=...,
    memory_mb=..., cpus=...)`."""

    def make(
        name: str = "task",
        *,
        test_sh: str = 'echo 1 > "$LOGS_DIR/verifier/reward.txt"',
        setup_sh: str | None = None,
        files: dict[str, str] | None = None,
        agent_timeout: float = 60.0,
        memory_mb: int = 1024,
        cpus: int | None = None,
    ) -> Path:
        root = tmp_path / "tasks" / name
        (root / "tests").mkdir(parents=True)
        (root / "environment" / "workspace").mkdir(parents=True)
        (root / "instruction.md").write_text(f"do {name}\n")
        environment = f"[environment]\nmemory_mb = {memory_mb}\n" + (f"cpus = {cpus}\n" if cpus else "")
        agent = f"[agent]\ntimeout_sec = {agent_timeout}\n\n[verifier]\ntimeout_sec = 30.0\n"
        (root / "task.toml").write_text(f"{environment}\n{agent}")
        (root / "tests" / "test.sh").write_text(test_sh + "\n")
        if setup_sh is not None:
            (root / "environment" / "setup.sh").write_text(setup_sh + "\n")
        for rel, text in (files or {}).items():
            (root / "environment" / "workspace" / rel).write_text(text)
        return root

    return make


def processes_started_in(directory: Path) -> list[int]:
    """Live processes whose working directory is `directory` (a sandbox command's outermost process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # it ended while we looked
                if os.readlink(entry / "cwd") == str(directory.resolve()):
                    found.append(int(entry.name))
    return found


@contextlib.contextmanager
def _until_done(remove_once: Callable[[], bool], period_s: float) -> Iterator[threading.Event]:
    """Call `remove_once` every `period_s` in a thread until it returns True; the event is set then."""
    done, stop = threading.Event(), threading.Event()

    def watch() -> None:
        while not stop.wait(period_s):
            if remove_once():
                done.set()
                return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join()


def sandbox_lost_when_marked(root: Path, mark: str) -> contextlib.AbstractContextManager[threading.Event]:
    """From outside, as a lost machine or a removed container would be: once a sandbox under `root`
    holds `app/<mark>`, remove its directory and kill its commands' process groups. The event is set
    once that is done."""

    def remove_marked() -> bool:
        for marked in root.glob(f"*/app/{mark}"):
            box = marked.parent.parent
            groups = {os.getpgid(pid) for pid in processes_started_in(box / "app")}
            shutil.rmtree(box)
            for group in groups:
                os.killpg(group, signal.SIGKILL)
            return True
        return False

    return _until_done(remove_marked, 0.1)


def container_lost_when_marked(url: str, mark: str) -> contextlib.AbstractContextManager[threading.Event]:
    """`sandbox_lost_when_marked` for the docker provider: once a container's /app holds `mark`,
    remove it (forced: its processes killed), as `docker rm -f` from outside would."""

    async def remove_marked() -> bool:
        async with aiodocker.Docker(url, api_version=API_VERSION) as docker:
            for container in await docker.containers.list():
                process = await container.exec(["test", "-e", f"/app/{mark}"])
                async with process.start() as stream:
                    while await stream.read_out() is not None:
                        pass
                if (await process.inspect())["ExitCode"] == 0:
                    await container.delete(force=True)
                    return True
        return False

    return _until_done(lambda: asyncio.run(remove_marked()), 0.2)
