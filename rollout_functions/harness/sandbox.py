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


class SandboxError(RuntimeError):
    """The sandbox itself failed (it could not be created, its setup failed, it was lost): the
    infrastructure's fault, never the agent's."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecResult:
    exit_code: int  # -signal when killed by one
    output: str  # stdout and stderr together, the tail kept
    timed_out: bool


class Sandbox(ABC):
    """One episode's isolated environment. Its commands run in `/app` in a process group of their
    own, under the task's resource limits, and are killed as a whole group at their timeout."""

    @abstractmethod
    async def exec(self, command: str, *, env: dict[str, str], timeout_s: float) -> ExecResult:
        """Run the shell command line `command` inside, with `env` added to the sandbox's own."""

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
