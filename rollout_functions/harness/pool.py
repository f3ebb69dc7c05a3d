"""A warm pool: sandboxes made ready ahead of their episodes (`--sandbox-pool N`).

Creating a sandbox for a task means laying out its workspace and running its `setup.sh`: seconds
an episode would wait for. `WarmPool` wraps any provider and keeps up to N sandboxes per task
ready, so a claim takes one that is already built and the pool builds its replacement in the
background, off the episode's critical path. A claim that finds none ready (the first of a task,
or more claims at once than N) creates its own, as without a pool. Each sandbox is still used by
one episode only: the pool hands out fresh sandboxes, it never reuses one.

Grader sandboxes (`setup=False`: empty, about to receive an agent's workspace) cost a directory
and are not pooled. A background build that fails is dropped (logged); the claim that would have
used it creates its own, whose failure is the episode's `sandbox_failed`.

Ready sandboxes outlive the event loop of the rollout step that built them (a local sandbox is a
directory); builds still running when a step's loop ends are cancelled and clean up after
themselves. `drain()` stops the builds and destroys what is ready; what is ready at exit is
destroyed then.
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread  # noqa: F401 (its exit hook registered before ours, so ours runs first)
import logging
import threading
from collections import defaultdict

from slimeish.rollout_functions.harness.sandbox import Sandbox, SandboxError, SandboxProvider
from slimeish.rollout_functions.harness.tasks import Task

log = logging.getLogger(__name__)


class WarmPool(SandboxProvider):
    def __init__(self, inner: SandboxProvider, size: int):
        if size < 1:
            raise ValueError(f"a warm pool holds at least one sandbox per task, got {size}")
        self.inner = inner
        self.size = size
        self._ready: defaultdict[str, list[Sandbox]] = defaultdict(list)  # by task directory
        self._building: defaultdict[str, set[asyncio.Task[None]]] = defaultdict(set)
        # at exit, while threads can still start (a destroy may use asyncio.to_thread): the hook the
        # standard library's own thread pools use, which runs before a plain atexit one
        threading._register_atexit(self._drain_at_exit)  # type: ignore[attr-defined]

    def ready(self, task: Task) -> int:
        """How many sandboxes for `task` wait to be claimed."""
        return len(self._ready[str(task.path)])

    async def create(self, task: Task, *, setup: bool = True) -> Sandbox:
        if not setup:
            return await self.inner.create(task, setup=False)
        ready = self._ready[str(task.path)]
        sandbox = ready.pop() if ready else None
        self.fill(task)
        return sandbox if sandbox is not None else await self.inner.create(task)

    def fill(self, task: Task) -> None:
        """Start building until ready and building together make the pool's size (each claim
        does; call it ahead of a task's first claim to have that one warm too)."""
        key = str(task.path)
        building = self._building[key]
        building.difference_update([b for b in building if b.done()])  # cancelled with an earlier step's loop
        for _ in range(self.size - len(self._ready[key]) - len(building)):
            build = asyncio.get_running_loop().create_task(self._build(task))
            building.add(build)
            build.add_done_callback(building.discard)

    async def _build(self, task: Task) -> None:
        try:
            sandbox = await self.inner.create(task)
        except SandboxError as exc:
            log.warning("a warm sandbox for %s could not be built (its claim will build its own): %s", task.name, exc)
            return
        self._ready[str(task.path)].append(sandbox)

    async def drain(self) -> None:
        """Stop the builds running in this loop and destroy every ready sandbox."""
        loop = asyncio.get_running_loop()
        running = [b for building in self._building.values() for b in building if b.get_loop() is loop]
        for build in running:
            build.cancel()
        await asyncio.gather(*running, return_exceptions=True)  # a cancelled build destroys its own
        waiting = [s for ready in self._ready.values() for s in ready]
        self._ready.clear()
        await asyncio.gather(*(s.destroy() for s in waiting))

    def _drain_at_exit(self) -> None:
        if any(self._ready.values()):
            asyncio.run(self.drain())
