"""The `docker` sandbox provider: a container per sandbox, spoken to through the Docker Engine API.

A sandbox is a container of the project's base image (docker_image.py, loaded into the daemon
when it lacks it) or of `--sandbox-image`, kept alive by `sleep infinity` under Docker's init.
What it sees:

- `/app`, `/tests`, `/logs`, `/tmp`: the container's own layer, written only by it, gone with it.
- `HOST_DIRS` (`/usr`, `/etc`, the project checkout with its `.venv` and `.cache/agents`, Python's
  installation) bind-mounted read-only at the host's paths: bash, python3, node and the agent
  programs are the host's, and no command can change them. Nothing else of the host is there:
  not other containers' layers, not other sandboxes' directories.
- No network (`network_mode none`: loopback only). The router, when a command needs it, is
  reached through `RouterBridge`: its socket in the sandbox's own host directory, mounted
  read-only at `/slimeish-net` with bridge.py beside it, and the forwarder run in front of the
  command by the container's python3, as the local provider does. A task that asks for the
  internet is refused (`SandboxError`): these containers have none.
- The task's `memory_mb` as the container's memory limit (no swap) and `cpus` as its CPU quota.

A command is an exec of `bash -c` in `/app` with only the sandbox's variables and those given. It
runs in a session of its own (an exec's process leads one) whose id it writes first to `/run`, so a
timeout kills its whole group from a second exec. A command the kernel killed at the memory limit
(the container's `oom_kill` count rose while it ran) is reported as `out_of_memory`. A container
that is gone or stopped when a command ends, or when the API is asked anything, is a
`SandboxError`: lost, never the agent's failure.

Each call opens its own API client: a provider outlives the event loops of the steps it serves
(as a warm pool's sandboxes do), and a client belongs to one loop. The daemon is `DOCKER_HOST`'s,
or the default socket's; dockerd.py starts one of our own where none answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import shutil
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiodocker
import aiohttp
from aiodocker.types import JSONValue

from slimeish.common.child_output import DRAIN_S, note_cut
from slimeish.rollout_functions.harness import bridge as bridge_script
from slimeish.rollout_functions.harness.bridge import HOSTS_NAME, INSIDE_DIR, RouterBridge
from slimeish.rollout_functions.harness.docker_image import image_archive
from slimeish.rollout_functions.harness.local import OUTPUT_TAIL
from slimeish.rollout_functions.harness.sandbox import (
    APP,
    LOGS,
    NO_NETWORK,
    TESTS,
    ExecResult,
    Network,
    Sandbox,
    SandboxError,
    SandboxProvider,
    describe_exit,
)
from slimeish.rollout_functions.harness.tasks import Task

API_VERSION = "v1.41"  # dockerd 20.10's (Debian 12's docker.io); later daemons still speak it
PROJECT = Path(__file__).resolve().parents[2]  # the checkout: its .venv, examples and .cache/agents
HOST_DIRS = tuple(dict.fromkeys(["/usr", "/etc", str(PROJECT), str(Path(sys.base_prefix).resolve())]))
OWN_ENV = {"APP_DIR": APP, "TESTS_DIR": TESTS, "LOGS_DIR": LOGS, "TMPDIR": "/tmp", "HOME": "/tmp"}
# the command's session id first, where a timeout's kill finds it; then the command itself
LEADER = 'echo $$ > "$0" && exec "$@"'
EXIT_POLL_S = 1.0  # how often a running command's exit is looked for, apart from its output's end
# the kernel's count of processes it killed at the container's memory limit (cgroup v1, then v2)
# "|| true": a container without either file has no count, which is not a failure
OOM_KILLS = (
    "cat /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events 2>/dev/null | grep ^oom_kill || true"
)
LOST_SETTLE_S = 5.0  # a failed API call waits this long for a container being removed to read as such
SCRIPT_NAME = "bridge.py"  # copied beside the hosts file, run by the container's python3
INSIDE_SCRIPT = f"{INSIDE_DIR}/{SCRIPT_NAME}"


@contextlib.asynccontextmanager
async def client(url: str | None) -> AsyncIterator[aiodocker.Docker]:
    """An API client for one call: a daemon that fails or is gone is the sandbox's failure."""
    try:
        async with aiodocker.Docker(url, api_version=API_VERSION) as docker:
            yield docker
    except (aiodocker.DockerError, aiohttp.ClientError, OSError) as exc:
        raise SandboxError(f"docker: {exc}") from exc


class DockerSandbox(Sandbox):
    def __init__(self, url: str | None, container_id: str, task: Task, net_dir: Path):
        self.url = url
        self.id = container_id
        self.task = task
        self.net_dir = net_dir  # mounted at INSIDE_DIR: the bridges' sockets, the hosts file, bridge.py

    async def exec(
        self, command: str, *, env: dict[str, str], timeout_s: float, network: Network = NO_NETWORK
    ) -> ExecResult:
        if network.internet:
            raise SandboxError(f"{self.task.name} asks for the internet; the docker provider's containers have none")
        try:
            result = await self._command(command, env, timeout_s, network)
        except SandboxError:  # an API call failed: when the container is gone, say that it was lost
            await self._alive("a command ran", settle_s=LOST_SETTLE_S)
            raise
        await self._alive(f"a command ran (it exited with {result.exit_code})")
        return result

    async def _command(self, command: str, env: dict[str, str], timeout_s: float, network: Network) -> ExecResult:
        bridge = RouterBridge(network.router, self.net_dir) if network.router is not None else None
        async with bridge if bridge is not None else contextlib.nullcontext():
            if bridge is not None:
                (self.net_dir / HOSTS_NAME).write_text(bridge.hosts_file.read_text())  # in place: it is mounted
                env = bridge.inside_env(env)
                inside = f"{INSIDE_DIR}/{bridge.dir.name}"
                front = bridge.inside_argv(python="python3", script=INSIDE_SCRIPT, inside_dir=inside)
            else:
                front = []
            oom_before = await self._oom_kills()
            leader = f"/run/slimeish-{uuid.uuid4().hex}"
            argv = ["bash", "-c", LEADER, leader, *front, "bash", "-c", command]
            result = await self._run(argv, OWN_ENV | env, timeout_s, leader)
        return dataclasses.replace(result, out_of_memory=await self._oom_kills() > oom_before)

    async def _run(self, argv: list[str], env: dict[str, str], timeout_s: float, leader: str) -> ExecResult:
        async with client(self.url) as docker:
            container = docker.containers.container(self.id)
            process = await container.exec(argv, environment=env, workdir=APP)
            chunks: list[bytes] = []

            async def read() -> None:
                async with process.start(timeout=None) as stream:
                    while (message := await stream.read_out()) is not None:
                        chunks.append(message.data)

            reader = asyncio.ensure_future(read())  # kept apart, so a timeout keeps what was said
            timed_out = False
            try:
                await asyncio.wait_for(_ended(process, reader), timeout_s)
            except TimeoutError:
                timed_out = True
                await self._kill(leader)
            except BaseException:  # the episode's own limit, the run stopping, or a failed inspect
                reader.cancel()
                with contextlib.suppress(SandboxError):
                    await asyncio.shield(self._kill(leader))
                raise
            cut = False
            try:  # the stream ends once every holder of the output is gone
                await asyncio.wait_for(reader, DRAIN_S)
            except TimeoutError:
                cut = True
            code = (await process.inspect())["ExitCode"]
        output = b"".join(chunks)
        output = note_cut(output) if cut else output
        return ExecResult(
            exit_code=137 if code is None else code,  # still running after its kill: as killed
            output=output.decode(errors="replace")[-OUTPUT_TAIL:],
            timed_out=timed_out,
        )

    async def _quick(self, argv: list[str]) -> str:
        """Run a short command of our own (no timeout of its own) and return its output. One that
        fails is a `SandboxError`: in a container being removed the exec itself fails, and what it
        prints is the runtime's error, not the command's output."""
        async with client(self.url) as docker:
            process = await docker.containers.container(self.id).exec(argv)
            out = []
            async with process.start(timeout=None) as stream:
                while (message := await stream.read_out()) is not None:
                    out.append(message.data)
            code = (await process.inspect())["ExitCode"]
        output = b"".join(out).decode(errors="replace")
        if code != 0:
            raise SandboxError(f"our own command in the container {self.id[:12]} exited with {code}: {output[-300:]}")
        return output

    async def _kill(self, leader: str) -> None:
        """Kill the command's whole process group (its session leader's pid is in `leader`)."""
        await self._quick(["bash", "-c", 'kill -KILL -- -"$(cat "$0")"; rm -f "$0"', leader])

    async def _oom_kills(self) -> int:
        return sum(int(line.split()[1]) for line in (await self._quick(["bash", "-c", OOM_KILLS])).splitlines())

    async def _alive(self, doing: str, settle_s: float = 0.0) -> None:
        """Raise a `SandboxError` saying how the container was lost, if it was. `settle_s`: how long a
        container that still reads as running may take to read otherwise (an exec refused as
        "stopped" comes before the daemon's own state says so)."""
        deadline = time.monotonic() + settle_s
        async with client(self.url) as docker:
            while True:
                try:
                    state = (await docker.containers.container(self.id).show())["State"]
                except aiodocker.DockerError as exc:
                    raise SandboxError(f"the container {self.id[:12]} was removed while {doing}") from exc
                if not state["Running"] or time.monotonic() >= deadline:
                    break
                await asyncio.sleep(0.1)
        if not state["Running"]:
            fate = "was removed" if state["Status"] in ("removing", "dead") else "stopped"
            raise SandboxError(f"the container {self.id[:12]} {fate} while {doing} ({state['Status']})")

    async def upload(self, src: Path, dest: str) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(src, arcname=".")
        result = await self._quick(["bash", "-c", 'rm -rf "$0" && mkdir -p "$0" && echo ok', dest])
        if result.strip() != "ok":
            raise SandboxError(f"could not empty {dest} in the container {self.id[:12]}: {result[-500:]}")
        async with client(self.url) as docker:
            await docker.containers.container(self.id).put_archive(dest, buf.getvalue())

    async def download(self, src: str, dest: Path) -> None:
        async with client(self.url) as docker:
            archive = await docker.containers.container(self.id).get_archive(src)
        top = Path(src).name
        with archive:
            members = []
            for member in archive.getmembers():  # `src` arrives as its own directory: its contents go into `dest`
                name = member.name.split("/", 1)
                if name[0] == top and len(name) == 2:
                    member.name = name[1]
                    members.append(member)
            dest.mkdir(parents=True)
            await asyncio.to_thread(archive.extractall, dest, members, filter="tar")

    async def destroy(self) -> None:
        with contextlib.suppress(SandboxError):  # gone already is destroyed
            async with client(self.url) as docker:
                with contextlib.suppress(aiodocker.DockerError):
                    await docker.containers.container(self.id).delete(force=True)
        shutil.rmtree(self.net_dir, ignore_errors=True)


class DockerProvider(SandboxProvider):
    def __init__(self, image: str | None = None, url: str | None = None, host_dirs: tuple[str, ...] = HOST_DIRS):
        self.image = image  # None: the project's base image, loaded on first use
        self.url = url  # None: DOCKER_HOST, else the default socket
        self.host_dirs = host_dirs

    async def _image(self, docker: aiodocker.Docker) -> str:
        if self.image is not None:
            return self.image
        tag, archive = image_archive()
        try:
            await docker.images.inspect(tag)
        except aiodocker.DockerError:
            await docker.images.import_image(archive)
        return tag

    async def create(self, task: Task, *, setup: bool = True) -> Sandbox:
        if task.setup_internet or task.agent_internet or task.verifier_internet:
            raise SandboxError(f"{task.name} asks for the internet; the docker provider's containers have none")
        net_dir = Path(tempfile.mkdtemp(prefix="slimeish-net-"))  # short: socket paths have a length limit
        (net_dir / HOSTS_NAME).write_text("127.0.0.1 localhost\n")
        shutil.copy(bridge_script.SCRIPT, net_dir / SCRIPT_NAME)
        binds = [f"{path}:{path}:ro" for path in self.host_dirs]
        binds += [f"{net_dir}:{INSIDE_DIR}:ro", f"{net_dir / HOSTS_NAME}:/etc/hosts:ro"]
        memory = task.memory_mb * 1024 * 1024
        host_config: dict[str, JSONValue] = {"NetworkMode": "none", "Init": True, "Binds": list(binds)}
        host_config |= {"Memory": memory, "MemorySwap": memory}  # no swap: the kernel kills at the limit
        if task.cpus is not None:
            host_config["NanoCpus"] = int(task.cpus * 1e9)
        try:
            async with client(self.url) as docker:
                config = {"Image": await self._image(docker), "Cmd": ["sleep", "infinity"], "WorkingDir": APP}
                container = await docker.containers.run({**config, "HostConfig": host_config})
        except BaseException as exc:
            shutil.rmtree(net_dir, ignore_errors=True)
            if isinstance(exc, SandboxError):
                raise SandboxError(f"{task.name}: could not start a container: {exc}") from exc
            raise
        sandbox = DockerSandbox(self.url, container.id, task, net_dir)
        try:
            if setup:
                await self._lay_out(sandbox, task)
        except BaseException:
            await sandbox.destroy()
            raise
        return sandbox

    async def _lay_out(self, sandbox: DockerSandbox, task: Task) -> None:
        if task.workspace.is_dir():
            await sandbox.upload(task.workspace, APP)
        if not task.setup_script.is_file():
            return
        with tempfile.TemporaryDirectory() as setup:
            shutil.copy(task.setup_script, Path(setup) / "setup.sh")
            await sandbox.upload(Path(setup), "/run/slimeish-setup")
        result = await sandbox.exec("bash /run/slimeish-setup/setup.sh", env={}, timeout_s=task.build_timeout_s)
        if result.exit_code != 0:
            state = describe_exit(result, task)
            raise SandboxError(f"{task.name}: environment/setup.sh {state}: {result.output[-500:]}")


async def _ended(process: aiodocker.execs.Exec, reader: asyncio.Future[None]) -> None:
    """Until the command ended: its output's end, or its exit when a process it left running (a
    server started in the background) still holds the output. `reader` goes on either way."""
    while not reader.done():
        await asyncio.wait([reader], timeout=EXIT_POLL_S)
        if not reader.done() and (await process.inspect())["ExitCode"] is not None:  # None until it started
            return
