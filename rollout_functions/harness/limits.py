"""A task's resources on the local provider, without cgroups: memory watched, CPUs pinned.

Memory: `MemoryWatch` reads /proc once every `POLL_S` for all the commands running under it, sums
each command's resident memory (its process tree and process group) and kills the command's whole
group once the sum passes the task's `memory_mb`, saying so, so the episode knows whose failure it
was. Shared pages are counted in every process that maps them, so the limit errs on the strict
side. A poll can be outrun by a fast allocation, so every process also has a data-segment limit
of `BACKSTOP` times the memory (`prlimit --data`): past it allocations fail.

CPUs: a task's `cpus` pins its commands to that many cores (rounded up), taken in turn from the
cores this process may use, so concurrent sandboxes spread over the machine (`taskset`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import signal
from dataclasses import dataclass
from pathlib import Path

POLL_S = 0.1
BACKSTOP = 2  # the data-segment limit of one process, in multiples of the task's memory
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(kw_only=True, slots=True)
class Watched:
    pgid: int  # the command's process group (its leader's pid)
    limit_bytes: int
    exceeded: bool = False


def _processes() -> list[tuple[int, int, int, int]]:
    """(pid, ppid, pgrp, resident bytes) of every process on the machine."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
        found.append((int(entry.name), int(fields[1]), int(fields[2]), int(fields[21]) * PAGE))
    return found


def resident_bytes(processes: list[tuple[int, int, int, int]], pgid: int) -> int:
    """The resident memory of the tree under `pgid` and of its process group (a command under
    bubblewrap lives in a tree; one without it may leave the tree but stays in the group)."""
    children: dict[int, list[int]] = {}
    for pid, ppid, _, _ in processes:
        children.setdefault(ppid, []).append(pid)
    members: set[int] = set()
    todo = [pgid, *(pid for pid, _, pgrp, _ in processes if pgrp == pgid)]
    while todo:  # the group and everything under any of its members
        pid = todo.pop()
        if pid not in members:
            members.add(pid)
            todo.extend(children.get(pid, []))
    rss = {pid: resident for pid, _, _, resident in processes}
    return sum(rss.get(pid, 0) for pid in members)


class MemoryWatch:
    def __init__(self) -> None:
        self._watched: dict[int, Watched] = {}
        self._task: asyncio.Task[None] | None = None

    def watch(self, pgid: int, limit_bytes: int) -> Watched:
        watched = self._watched[pgid] = Watched(pgid=pgid, limit_bytes=limit_bytes)
        if self._task is None or self._task.done():  # one poller for all, started in the running loop
            self._task = asyncio.get_running_loop().create_task(self._poll())
        return watched

    def unwatch(self, watched: Watched) -> None:
        self._watched.pop(watched.pgid, None)

    async def _poll(self) -> None:
        while self._watched:
            processes = _processes()
            for watched in list(self._watched.values()):
                if resident_bytes(processes, watched.pgid) > watched.limit_bytes:
                    watched.exceeded = True
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(watched.pgid, signal.SIGKILL)
            await asyncio.sleep(POLL_S)


class CpuPlan:
    """Which cores a task's commands are pinned to: `cpus` of them (rounded up), in turn."""

    def __init__(self) -> None:
        self.cores = sorted(os.sched_getaffinity(0))
        self._next = itertools.cycle(range(len(self.cores)))

    def taskset_argv(self, cpus: float | None) -> list[str]:
        if cpus is None or math.ceil(cpus) >= len(self.cores):
            return []
        start = next(self._next)
        picked = [self.cores[(start + i) % len(self.cores)] for i in range(math.ceil(cpus))]
        return ["taskset", "--cpu-list", ",".join(map(str, sorted(picked)))]
