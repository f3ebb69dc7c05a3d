"""The `local` sandbox provider: a fresh directory per sandbox on this machine.

Each sandbox is `ROOT/<id>/{app,tests,logs,tmp}`. With bubblewrap (Debian's `bubblewrap`, used when
`bwrap` is on PATH unless `--sandbox-bwrap off`) every command runs in a mount and PID namespace of
its own: the host's top-level directories read-only, the sandbox's own directories at `/app`,
`/tests`, `/logs` and a private `/tmp`, and `ROOT` (other episodes' sandboxes) not there at all, so
an agent can write only its workspace and never sees another episode's. Without bubblewrap a
command runs in `ROOT/<id>/app` with the same environment variables but no confinement: a
development fallback, said at start-up.

A command sees none of the host's environment: only `PASSED_HOST_VARS` (where programs are found,
the locale), the sandbox's own variables and those the caller gives. Under bubblewrap a command
whose network is off gets a network namespace holding only loopback; the router, when the command
needs it, is reached through `RouterBridge` (bridge.py). Without bubblewrap the network is the
host's.

Either way a command gets a process group of its own (killed as a whole at its timeout), the task's
memory and CPUs (limits.py: the group killed when its resident memory passes `memory_mb`, pinned
to `cpus` cores), and no core dumps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import uuid
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Literal

from slimeish.common.child_output import collecting, note_cut
from slimeish.rollout_functions.harness.bridge import INSIDE_DIR, RouterBridge
from slimeish.rollout_functions.harness.limits import BACKSTOP, CpuPlan, MemoryWatch
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

log = logging.getLogger(__name__)

OUTPUT_TAIL = 64 * 1024  # characters of a command's output kept
DIRS = {APP: "app", TESTS: "tests", LOGS: "logs", "/tmp": "tmp"}
SKIPPED_TOP_LEVEL = {"/tmp", "/proc", "/dev"}  # replaced by the sandbox's own
PASSED_HOST_VARS = ("PATH", "LANG", "LC_ALL", "TZ")  # no credentials: programs installed on the host need them


def default_root() -> Path:
    return Path(tempfile.gettempdir()) / "slimeish-sandboxes"


class LocalSandbox(Sandbox):
    def __init__(self, root: Path, task: Task, bwrap: bool, memory: MemoryWatch, cpus: list[str]):
        self.dir = root / uuid.uuid4().hex
        self.task = task
        self.bwrap = bwrap
        self.memory = memory
        self.cpus = cpus  # taskset's argv pinning this sandbox's commands, or nothing
        self._running: set[int] = set()  # process groups of commands still running
        for sub in DIRS.values():
            (self.dir / sub).mkdir(parents=True)
        (self.dir / "logs" / "verifier").mkdir()
        (self.dir / "logs" / "agent").mkdir()

    def host_path(self, path: str) -> Path:
        """Where the sandbox path `path` (under /app, /tests, /logs or /tmp) lives on the host."""
        for top, sub in DIRS.items():
            if path == top or path.startswith(top + "/"):
                return self.dir / sub / path[len(top) :].lstrip("/")
        raise ValueError(f"{path!r} is outside the sandbox's directories {sorted(DIRS)}")

    def _env(self, env: dict[str, str]) -> dict[str, str]:
        seen = {top: top if self.bwrap else str(self.host_path(top)) for top in DIRS}
        own = {"APP_DIR": seen[APP], "TESTS_DIR": seen[TESTS], "LOGS_DIR": seen[LOGS]}
        own |= {"TMPDIR": seen["/tmp"], "HOME": seen["/tmp"]}  # programs write their config under HOME
        host = {name: os.environ[name] for name in PASSED_HOST_VARS if name in os.environ}
        return {**host, **own, **env}

    def _argv(self, command: str, network: Network, bridge: RouterBridge | None) -> list[str]:
        memory = self.task.memory_mb * 1024 * 1024 * BACKSTOP
        argv = ["prlimit", f"--data={memory}", "--core=0", "--", *self.cpus]
        if self.bwrap:
            argv += bwrap_argv(self.dir, self.dir.parent, internet=network.internet, bridge=bridge)
        if bridge is not None:
            argv += bridge.inside_argv()
        return [*argv, "bash", "-c", command]

    def _bridge(self, network: Network) -> AbstractAsyncContextManager[RouterBridge | None]:
        """The router's bridge when the command has no network of its own to reach it by."""
        if network.router is None or network.internet or not self.bwrap:
            return contextlib.nullcontext()
        return RouterBridge(network.router)

    async def exec(
        self, command: str, *, env: dict[str, str], timeout_s: float, network: Network = NO_NETWORK
    ) -> ExecResult:
        try:
            async with self._bridge(network) as bridge:
                env = bridge.inside_env(env) if bridge is not None else env
                result = await self._run(self._argv(command, network, bridge), env, timeout_s)
        except OSError as exc:  # its directory is gone, prlimit/bwrap cannot start, no socket for the bridge
            raise SandboxError(f"could not start a command in {self.dir}: {exc}") from exc
        if not self.dir.is_dir():  # removed from outside while it ran: however the command ended, it was lost
            raise SandboxError(f"the sandbox {self.dir} was removed while a command ran in it ({result.exit_code=})")
        return result

    async def _run(self, argv: list[str], env: dict[str, str], timeout_s: float) -> ExecResult:
        async with collecting(
            argv,
            merge_stderr=True,
            keep=4 * OUTPUT_TAIL,  # bytes: a character takes at most 4
            cwd=self.host_path(APP),
            env=self._env(env),
            start_new_session=True,  # its own process group: the whole tree is killed together
        ) as child:
            self._running.add(child.pid)
            watched = self.memory.watch(child.pid, self.task.memory_mb * 1024 * 1024)
            timed_out = False
            try:  # its exit: a process it left running (outside bubblewrap) may hold its output on
                await asyncio.wait_for(child.wait(), timeout_s)
            except TimeoutError:
                timed_out = True
                _kill_group(child.pid)
                await child.wait()
            except asyncio.CancelledError:  # the episode's own limit, or the run stopping
                _kill_group(child.pid)
                await child.wait()
                raise
            finally:
                self._running.discard(child.pid)
                self.memory.unwatch(watched)
            output = await child.output()
        said = note_cut(output.stdout) if output.cut else output.stdout
        assert child.returncode is not None
        return ExecResult(
            exit_code=child.returncode,
            output=said.decode(errors="replace")[-OUTPUT_TAIL:],
            timed_out=timed_out,
            out_of_memory=watched.exceeded,
        )

    async def upload(self, src: Path, dest: str) -> None:
        target = self.host_path(dest)
        await asyncio.to_thread(_replace_tree, src, target)

    async def download(self, src: str, dest: Path) -> None:
        await asyncio.to_thread(shutil.copytree, self.host_path(src), dest, symlinks=True)

    async def destroy(self) -> None:
        for pgid in list(self._running):
            _kill_group(pgid)
        await asyncio.to_thread(shutil.rmtree, self.dir, ignore_errors=True)


def _replace_tree(src: Path, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(src, target, symlinks=True)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def bwrap_argv(sandbox: Path, root: Path, *, internet: bool, bridge: RouterBridge | None) -> list[str]:
    """bubblewrap's arguments for `sandbox`: the host read-only, the sandbox's directories at
    Harbor's paths, every other sandbox under `root` hidden, a PID namespace that dies with us,
    and without `internet` a network namespace holding only loopback (and `bridge`'s socket)."""
    argv = ["bwrap", "--die-with-parent", "--unshare-pid", "--new-session", "--dev", "/dev", "--proc", "/proc"]
    if not internet:
        argv.append("--unshare-net")
    if bridge is not None:
        argv += ["--ro-bind", str(bridge.dir), INSIDE_DIR]
    for entry in sorted(Path("/").iterdir()):
        top = str(entry)
        if top in SKIPPED_TOP_LEVEL:
            continue
        if entry.is_symlink():  # /bin -> usr/bin on merged-/usr systems
            argv += ["--symlink", os.readlink(entry), top]
        elif entry.is_dir():
            argv += ["--ro-bind", top, top]
    if bridge is not None:  # over the host's /etc: the router's host name is the inside end's address
        argv += ["--ro-bind", str(bridge.hosts_file), "/etc/hosts"]
    if not str(root).startswith("/tmp/"):  # under /tmp it is hidden already: /tmp is the sandbox's own
        argv += ["--tmpfs", str(root)]
    for inside, sub in DIRS.items():
        argv += ["--bind", str(sandbox / sub), inside]
    return [*argv, "--chdir", APP]


class LocalProvider(SandboxProvider):
    def __init__(self, root: Path | None = None, bwrap: Literal["auto", "on", "off"] = "auto"):
        self.root = root or default_root()
        found = shutil.which("bwrap") is not None
        if bwrap == "on" and not found:
            raise ValueError("--sandbox-bwrap on needs bubblewrap: apt-get install bubblewrap")
        self.bwrap = found and bwrap != "off"
        self.memory = MemoryWatch()
        self.cpu_plan = CpuPlan()
        if not self.bwrap:
            log.warning("local sandboxes run without bubblewrap: agents are not confined to their workspace")

    async def create(self, task: Task, *, setup: bool = True) -> Sandbox:
        try:
            sandbox = LocalSandbox(self.root, task, self.bwrap, self.memory, self.cpu_plan.taskset_argv(task.cpus))
        except OSError as exc:
            raise SandboxError(f"could not create a sandbox under {self.root}: {exc}") from exc
        try:
            if setup:
                await self._lay_out(sandbox, task)
        except OSError as exc:  # copying the workspace in
            await sandbox.destroy()
            raise SandboxError(f"{task.name}: could not lay out the workspace: {exc}") from exc
        except BaseException:
            await sandbox.destroy()
            raise
        return sandbox

    async def _lay_out(self, sandbox: LocalSandbox, task: Task) -> None:
        if task.workspace.is_dir():
            await sandbox.upload(task.workspace, APP)
        if not task.setup_script.is_file():
            return
        shutil.copy(task.setup_script, sandbox.host_path("/tmp/setup.sh"))
        tmp = "/tmp" if sandbox.bwrap else str(sandbox.host_path("/tmp"))
        network = Network(internet=task.setup_internet)
        result = await sandbox.exec(f"bash {tmp}/setup.sh", env={}, timeout_s=task.build_timeout_s, network=network)
        if result.exit_code != 0:
            state = describe_exit(result, task)
            raise SandboxError(f"{task.name}: environment/setup.sh {state}: {result.output[-500:]}")
