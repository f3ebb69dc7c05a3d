"""slime's background event loop for plugins (`from slime.utils.async_utils import run`): `run(coro)`
runs a coroutine on one loop that lives in a daemon thread for the whole process and blocks
until it is done, so a synchronous rollout function can keep async work (a worker pool, HTTP
clients) alive across rollout calls."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["AsyncLoopThread", "get_async_loop", "run"]

T = TypeVar("T")


class AsyncLoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="slime-async-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Schedule `coro` on the background loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_loop: AsyncLoopThread | None = None
_lock = threading.Lock()  # async mode calls rollout functions from several threads


def get_async_loop() -> AsyncLoopThread:
    global _loop
    with _lock:
        if _loop is None:
            _loop = AsyncLoopThread()
        return _loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on the background loop and return its result."""
    return get_async_loop().run(coro)
