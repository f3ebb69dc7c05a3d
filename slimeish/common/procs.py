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
from collections.abc import Iterator, Sequence
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


# `guarded_shell`'s script (bash, as sh cannot name an fd above 9; POSIX mode, so that no
# $BASH_ENV runs first): $1 is the command line, $2 the fd of the lifeline's read end. First every
# other descriptor past stdio is closed: a starter on uvloop (Ray's workers) hands its children
# all its inheritable ones, which the command must not hold (a pipe the starter reads to its end
# would wait for every holder; the worker's log files and sockets are not the command's). The
# watchdog, started next, reads the lifeline until EOF, i.e. until its starter's end is closed (by
# the starter, or by its death, however it dies), then kills the whole group; it ignores the
# signals a group gets (SIGHUP when the group is orphaned with a stopped member). It is a process
# of its own, not the shell leading the group: Ray SIGKILLs a force-killed worker's direct
# children, the leader among them, and a killed shell runs no trap. fd 3 carries stdin past bash's
# /dev/null for background jobs.
_GUARDED = (
    'for fd in /proc/$$/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] && [ "$fd" != "$2" ] && eval "exec $fd>&-"; done; '
    '( trap "" HUP INT TERM; read -r -u "$2" _; kill -KILL 0 ) </dev/null >/dev/null 2>&1 & eval "exec $2<&-"; '
    'exec 3<&0; sh -c "$1" 0<&3 3<&- & wait $!'
)


@contextlib.contextmanager
def guarded_shell(command: str) -> Iterator[tuple[list[str], int]]:
    """(argv, fd): start `argv` inside the block with `start_new_session=True` and `pass_fds=[fd]`,
    and shell `command`'s whole process group is killed once this process dies, however it dies (a
    group in a session of its own outlives its starter otherwise), or once the block is left. There
    is no window: a watchdog whose starter is already gone finds its lifeline closed at once."""
    read_end, write_end = os.pipe()  # neither is inherited by other children: only `pass_fds` passes one
    try:
        yield ["bash", "--posix", "-c", _GUARDED, "guarded", command, str(read_end)], read_end
    finally:
        os.close(read_end)
        os.close(write_end)


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
