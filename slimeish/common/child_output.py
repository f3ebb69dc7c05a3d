"""A child process's output, read apart from its exit.

asyncio's own pipes tie the two together: on Python 3.11.7 and later `Process.wait()` returns only
once every pipe is closed, so a process the child left running (a server started in the
background) that holds its stdout keeps the caller waiting for as long as it lives. `collecting`
sees the exit when it happens, then waits a bounded time for the rest of the output. The pipes are
our own, not the loop's: uvloop's are sockets, which a command cannot open as `/dev/stdout`; files
would not do either (a command writing `> /dev/stdout` would truncate one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

DRAIN_S = 10.0  # how long the output may stay open after the child's exit


def note_cut(output: bytes) -> bytes:
    """`output` with a last line saying it was cut short."""
    newline = b"" if output.endswith(b"\n") or not output else b"\n"
    return output + newline + b"(output cut: a process the command left running still holds it)\n"


@dataclass(frozen=True)
class Output:
    stdout: bytes
    stderr: bytes  # b"" when merged into stdout
    cut: bool  # a process the child left running still held them once the drain was over


class _Kept(asyncio.Protocol):
    """What one pipe brought (its last `keep` bytes, or all), and its end."""

    def __init__(self, keep: int | None) -> None:
        self.keep = keep
        self.data = bytearray()
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.data += data
        if self.keep is not None and len(self.data) > 2 * self.keep:  # trimmed now and then, not per write
            del self.data[: -self.keep]

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended.set_result(None)

    def value(self) -> bytes:
        return bytes(self.data if self.keep is None else self.data[-self.keep :])


class _ExitWatch(asyncio.SubprocessProtocol):
    def __init__(self) -> None:
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def process_exited(self) -> None:
        self.exited.set_result(None)


class Child:
    """A started child: its pid, its exit, then its output."""

    def __init__(self, process: asyncio.SubprocessTransport, watch: _ExitWatch, out: _Kept, err: _Kept | None):
        self._process = process
        self._watch = watch
        self._out = out
        self._err = err

    @property
    def pid(self) -> int:
        return self._process.get_pid()

    @property
    def returncode(self) -> int | None:
        return self._process.get_returncode()

    async def wait(self) -> int:
        """Its exit code, as soon as it exits, whoever still holds its output."""
        await asyncio.shield(self._watch.exited)
        code = self.returncode
        assert code is not None
        return code

    async def output(self, drain_s: float = DRAIN_S) -> Output:
        """Its output once it exited, with what a process still holding the pipes writes within
        `drain_s`; after that they are cut."""
        await self.wait()
        pipes = [self._out] if self._err is None else [self._out, self._err]
        _, pending = await asyncio.wait([p.ended for p in pipes], timeout=drain_s)
        return Output(self._out.value(), b"" if self._err is None else self._err.value(), cut=bool(pending))


@contextlib.asynccontextmanager
async def collecting(
    argv: list[str],
    *,
    merge_stderr: bool = False,
    keep: int | None = None,
    stdin: Any = subprocess.DEVNULL,
    **popen: Any,
) -> AsyncIterator[Child]:
    """Start `argv` with its stdout and stderr read as they come, keeping the last `keep` bytes of
    each (all without it); stderr goes into stdout with `merge_stderr`. `stdin` and `popen`: what
    `subprocess.Popen` takes. Leaving the block stops reading (a process still writing then gets
    SIGPIPE) and kills the child, not its group, if it still runs."""
    loop = asyncio.get_running_loop()
    readers: list[asyncio.BaseTransport] = []
    pipes: list[_Kept] = []
    write_ends: list[int] = []
    try:
        for _ in range(1 if merge_stderr else 2):
            read_end, write_end = os.pipe()
            write_ends.append(write_end)
            reader, pipe = await loop.connect_read_pipe(lambda: _Kept(keep), os.fdopen(read_end, "rb", buffering=0))
            readers.append(reader)
            pipes.append(pipe)
        stderr = subprocess.STDOUT if merge_stderr else write_ends[1]
        process, watch = await loop.subprocess_exec(
            _ExitWatch, *argv, stdin=stdin, stdout=write_ends[0], stderr=stderr, **popen
        )
    except BaseException:
        for transport in readers:
            transport.close()
        raise
    finally:  # the child has its own copies: ours would keep the pipes from ever ending
        for write_end in write_ends:
            os.close(write_end)
    try:
        yield Child(process, watch, pipes[0], None if merge_stderr else pipes[1])
    finally:
        process.close()  # kills it if it still runs
        await asyncio.shield(watch.exited)  # reaped while the loop still runs
        for transport in readers:
            transport.close()
