"""Child processes on loopback: free ports, health waits, and clean shutdown.

Used by `slimeish train` to start the buffer, engines and router, and by integration tests to
start the same real processes. Children get their own process group so Ctrl-C in the parent
and test teardown stop the whole tree.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Poll `url` until it answers 200; fail early if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with code {proc.returncode} before {url} became ready")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout:.0f}s")


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Linux: SIGTERM this child when its parent dies, so a killed launcher leaves no orphans.
    A `preexec_fn`; the signal follows the thread that started the child, so start it from one
    that lives as long as the child should."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


# `guarded_shell`'s script: $1 is the command line, $2 the pid of the process starting it. Armed
# first (SIGTERM, which `die_with_parent` sends when that process dies, kills the whole group),
# then checked that $2 is still its parent (it may have died before the signal was armed), and only
# then is the command started, in the background so that the trap runs while it does. fd 3 carries
# stdin past sh's /dev/null for background jobs.
_GUARDED = 'trap "kill -KILL 0" TERM; [ "$PPID" = "$2" ] || exit 137; exec 3<&0; sh -c "$1" 0<&3 3<&- & wait $!'


def guarded_shell(command: str) -> list[str]:
    """The argv that runs shell `command` so that its whole process group (start it with
    `start_new_session=True` and `preexec_fn=die_with_parent`) is killed if the starting process dies,
    however it dies: a group in a session of its own outlives its starter otherwise. There is no
    window: a command whose starter died before the guard was armed never starts."""
    return ["sh", "-c", _GUARDED, "guarded", command, str(os.getpid())]


class ManagedProcess:
    """A child process in its own process group, stopped (SIGTERM, then SIGKILL) on `stop()`.

    Its own group keeps Ctrl-C in the parent's terminal from reaching it (the parent stops it in
    order); on Linux it also gets SIGTERM if the parent dies without stopping it."""

    def __init__(self, args: Sequence[str], *, log_path: Path | None = None, env: dict[str, str] | None = None):
        self.args = list(args)
        self.log_path = log_path
        self._log = open(log_path, "ab") if log_path else None  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.args,
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if self._log else subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )

    @classmethod
    def slimeish(cls, *argv: str, **kwargs) -> ManagedProcess:
        """Run `slimeish ARGV...` with the current interpreter."""
        return cls([sys.executable, "-m", "slimeish", *argv], **kwargs)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the whole process group (SIGKILL simulates a crash)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.kill(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill(signal.SIGKILL)
                self.proc.wait()
        if self._log:
            self._log.close()

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
