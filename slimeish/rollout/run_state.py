"""What the rollout calls of one training run share: `RolloutRun`.

`slimeish train` runs the rollout function in several threads at once (each with its own event
loop) and again for every evaluation; what those calls must share lives on one object the run
creates and hands them as `args.rollout_run`, rather than in module globals that outlive a run.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections import deque
from typing import Any

# The `args` attribute that carries the run's `RolloutRun` to the rollout function.
RUN_ARG = "rollout_run"


class EpisodeSlots:
    """A counting semaphore that event loops in different threads share.

    The async producer runs several rollout calls at once, each in its own thread and event loop;
    `--rollout-concurrency` must bound the episodes of all of them together, so a group whose slow
    member still runs holds one slot, not n, and its finished siblings' slots go to other groups.
    """

    def __init__(self, limit: int):
        self._lock = threading.Lock()
        self._free = limit
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    async def __aenter__(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free > 0:
                self._free -= 1
                return
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, future))
        try:
            await future
        except asyncio.CancelledError:
            with self._lock:
                if (loop, future) in self._waiters:
                    self._waiters.remove((loop, future))
            if future.done() and not future.cancelled():  # granted, then cancelled: pass the slot on
                self.release()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        with self._lock:
            while self._waiters:
                loop, future = self._waiters.popleft()
                try:  # hand the slot over in the waiter's own loop, where its future lives
                    loop.call_soon_threadsafe(self._grant, future)
                    return
                except RuntimeError:  # that loop is closed: nobody waits there any more
                    continue
            self._free += 1

    def _grant(self, future: asyncio.Future[None]) -> None:
        if future.cancelled():  # gave up after release() picked it: the next waiter gets the slot
            self.release()
        else:
            future.set_result(None)


class RolloutRun:
    """One run's shared rollout state: the episode slots, where the next rollout call starts among
    the routers, the eval group namespace, and whether the run is stopping."""

    def __init__(self) -> None:
        # Set when the run stops (finished, interrupted, or a part given up): rollout code that
        # waits for a router to come back gives up at once, so no thread keeps the process alive
        # retrying a router that is gone for good.
        self.stopping = threading.Event()
        # Eval prompts are drawn afresh at every evaluation (and again after a resume): the run's
        # nonce keeps their group ids apart. Training group indices never repeat within a run.
        self.eval_nonce = uuid.uuid4().hex[:8]
        self._slots: dict[int, EpisodeSlots] = {}
        self._lock = threading.Lock()
        self._calls = itertools.count()

    def episode_slots(self, limit: int) -> EpisodeSlots:
        """The slots for `--rollout-concurrency` = `limit`, shared by every rollout call of the run."""
        with self._lock:
            return self._slots.setdefault(limit, EpisodeSlots(limit))

    def first_router(self, n_routers: int) -> int:
        """Where the next rollout call starts among equally loaded routers: calls that each open a
        few sessions must not all begin with the first router."""
        return next(self._calls) % n_routers


def rollout_run(args: Any) -> RolloutRun:
    """The run a rollout call belongs to. A call made outside `slimeish train` (a test, a script
    calling a rollout function itself) has no run around it and is a run of its own."""
    run = getattr(args, RUN_ARG, None)
    if run is None:
        return RolloutRun()
    if not isinstance(run, RolloutRun):
        raise TypeError(f"args.{RUN_ARG} is slimeish's own (a RolloutRun), got {type(run).__name__}")
    return run
