"""The router inside a sandbox without a network: a Unix socket, and a forwarder at each end.

A sandbox whose network is off has a network namespace of its own holding only loopback, so the
router, wherever it is, is out of its reach. `RouterBridge` (the host's end) listens on a Unix
socket in a directory that the sandbox mounts, and connects each connection to the router.
Inside, this file runs as a script in front of the command (`python -I -S bridge.py PORT SOCKET --
COMMAND...`): it listens on 127.0.0.1:PORT (the router's own port, or PORT + 10000 for a port
below 1024, which an unprivileged process cannot listen on), connects each connection to the
socket, and then runs the command and ends as it ends. The command's variables that name the
router (the session's URL) name 127.0.0.1:PORT instead (`RouterBridge.inside_env`), so a router
on another host or address works too, and the router is all the command reaches: nothing else
on the host, nothing outside. An https URL keeps its host name, which the TLS certificate is
checked against: the sandbox's /etc/hosts (`RouterBridge.hosts_file`) names 127.0.0.1 by it.

Standard library only: inside it runs with the sandbox's Python and none of slimeish's packages.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import shutil
import signal
import sys
import tempfile
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path

SOCKET_NAME = "router.sock"
INSIDE_DIR = "/slimeish-net"  # where the sandbox mounts the bridge's directory
INSIDE_HOST = "127.0.0.1"  # where the inside end listens: on the sandbox's own loopback
CHUNK = 64 * 1024
HOSTS_NAME = "hosts"  # the sandbox's /etc/hosts, in the bridge's directory
LOW_PORT_SHIFT = 10000  # a port below 1024 is listened on inside at this much higher
SCRIPT = str(Path(__file__).resolve())  # this file, run inside as the sandbox's end


def inside_port(port: int) -> int:
    """The port the inside end listens on for a router on `port`."""
    return port if port >= 1024 else port + LOW_PORT_SHIFT


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # a half-close, so the other side sees the request end
    except OSError:  # either end went away: the connection is over
        writer.close()


Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _splice(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: Callable[[], Awaitable[Streams]]
) -> None:
    """Connect one accepted connection to `upstream()` (an open_connection coroutine) both ways."""
    try:
        up_reader, up_writer = await upstream()
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    finally:
        up_writer.close()
        writer.close()


class RouterBridge:
    """The host's end for one command: a Unix socket in its own short directory (socket paths have
    a length limit) whose connections go to the router at `target`. The directory is made under
    `parent` when given (a container's, mounted at `INSIDE_DIR` for its whole life)."""

    def __init__(self, target: tuple[str, int], parent: Path | None = None):
        self.target = target
        self.dir = Path(tempfile.mkdtemp(prefix="slimeish-net-", dir=parent))
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> RouterBridge:
        # the router's name first (the first match wins), then the host's own entries (its hostname)
        host = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else "::1 localhost\n"
        self.hosts_file.write_text(f"127.0.0.1 localhost {self.target[0]}\n{host}")
        self._server = await asyncio.start_unix_server(self._accept, path=str(self.dir / SOCKET_NAME))
        os.chmod(self.dir, 0o755)
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await _splice(reader, writer, lambda: asyncio.open_connection(*self.target))
        finally:
            self._connections.discard(task)

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._connections):  # the command is over: whatever it left open goes too
            task.cancel()
        shutil.rmtree(self.dir, ignore_errors=True)

    def inside_env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` with each URL that names the router (an agent's base URL) naming the inside end,
        127.0.0.1 on the router's port, instead: the router's own host, whatever it is, is not on
        the sandbox's loopback-only network."""
        return {name: _to_inside(value, self.target) for name, value in env.items()}

    @property
    def hosts_file(self) -> Path:
        """The sandbox's /etc/hosts: the router's host name is 127.0.0.1 there (an https URL keeps it)."""
        return self.dir / HOSTS_NAME

    def inside_argv(
        self, python: str = sys.executable, script: str = SCRIPT, inside_dir: str = INSIDE_DIR
    ) -> list[str]:
        """What to run inside, before the command's own argv: this script (at `script`, run by
        `python`) as the sandbox's end, the bridge's directory mounted at `inside_dir`."""
        port = str(inside_port(self.target[1]))
        return [python, "-I", "-S", script, port, f"{inside_dir}/{SOCKET_NAME}", "--"]


def _to_inside(value: str, router: tuple[str, int]) -> str:
    url = urllib.parse.urlsplit(value)
    if url.scheme not in ("http", "https") or url.hostname is None:
        return value
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:  # not a port: not the router's URL
        return value
    if (url.hostname, port) != router:
        return value
    userinfo = url.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@" if userinfo else ""
    # https keeps a host name, which its certificate is checked against (the sandbox's /etc/hosts
    # names 127.0.0.1 by it); an address can only become 127.0.0.1
    host = url.hostname if url.scheme == "https" and not _is_address(url.hostname) else INSIDE_HOST
    return urllib.parse.urlunsplit(url._replace(netloc=f"{netloc}{host}:{inside_port(port)}"))


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _inside(port: int, socket_path: str, argv: list[str]) -> int:
    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _splice(reader, writer, lambda: asyncio.open_unix_connection(socket_path))

    server = await asyncio.start_server(accept, INSIDE_HOST, port)  # listening before the command starts
    async with server:
        proc = await asyncio.create_subprocess_exec(*argv)
        return await proc.wait()


def main() -> None:
    port, socket_path, dashes, *argv = sys.argv[1:]
    assert dashes == "--", sys.argv
    code = asyncio.run(_inside(int(port), socket_path, argv))
    if code < 0:  # killed by a signal: end by the same one, so the host sees what the command saw
        signal.signal(-code, signal.SIG_DFL)
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), -code)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
