"""The sandbox interface a harness episode runs in: one small seam, so that a local directory, a
Docker container or a remote sandbox (Modal, E2B, Daytona) is one module implementing it.

A sandbox shows Harbor's layout to what runs in it: the workspace at `/app` (the working
directory), the task's tests at `/tests`, the reward under `/logs/verifier`. A provider that
cannot mount those paths exactly (the local one without bubblewrap) says where they are through
`APP_DIR`, `TESTS_DIR` and `LOGS_DIR`, which every command sees in every provider.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from slimeish.rollout_functions.harness.tasks import Task

APP, TESTS, LOGS = "/app", "/tests", "/logs"


@dataclass(frozen=True, kw_only=True, slots=True)
class Network:
    """What a command inside may reach. Without `internet` it has a network of its own holding only
    loopback; `router` (the router's host and port) is then still reachable, at 127.0.0.1 on the
    same port, so that an agent talks to its session and to nothing else."""

    internet: bool = False
    router: tuple[str, int] | None = None


NO_NETWORK = Network()


class SandboxError(RuntimeError):
    """The sandbox itself failed (it could not be created, its setup failed, it was lost): the
    infrastructure's fault, never the agent's."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecResult:
    exit_code: int  # -signal when killed by one
    output: str  # stdout and stderr together, the tail kept
    timed_out: bool
    out_of_memory: bool = False  # killed at the task's memory limit


def describe_exit(result: ExecResult, task: Task) -> str:
    """How a command ended, for an outcome's reason."""
    if result.timed_out:
        return "timed out"
    if result.out_of_memory:
        return f"was killed at the task's memory limit ({task.memory_mb} MB)"
    return f"exited with {result.exit_code}"


class Sandbox(ABC):
    """One episode's isolated environment. Its commands run in `/app` in a process group of their
    own, under the task's resource limits, and are killed as a whole group at their timeout or
    when together they pass the task's memory."""

    @abstractmethod
    async def exec(
        self, command: str, *, env: dict[str, str], timeout_s: float, network: Network = NO_NETWORK
    ) -> ExecResult:
        """Run the shell command line `command` inside with the sandbox's own variables and `env`,
        nothing of the host's environment, and the network `network` allows."""

    @abstractmethod
    async def upload(self, src: Path, dest: str) -> None:
        """Copy the host directory `src` to the sandbox directory `dest` (its contents replace dest's)."""

    @abstractmethod
    async def download(self, src: str, dest: Path) -> None:
        """Copy the sandbox directory `src` to the new host directory `dest`."""

    @abstractmethod
    async def destroy(self) -> None:
        """Kill what still runs inside and free everything; safe to call twice."""


class SandboxProvider(ABC):
    @abstractmethod
    async def create(self, task: Task, *, setup: bool = True) -> Sandbox:
        """A fresh sandbox for `task`: its workspace laid out (and `environment/setup.sh` run) when
        `setup`, else empty (the grader's, about to receive an agent's workspace). Raises
        `SandboxError` when it cannot."""
