"""Automatic pipelining of script calls: concurrent writers share round trips.

A router writes for many sessions at once; awaiting each Lua script call alone costs a round
trip and a connection checkout apiece. Calls made while a batch is in flight wait and go out
together in the next pipeline (non-transactional: each script stays atomic on its own, and
each caller gets its own result or error).
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError


class ScriptBatcher:
    def __init__(self, redis: Redis, max_batch: int = 256) -> None:
        self.redis = redis
        self.max_batch = max_batch
        self._queue: list[tuple[AsyncScript, list[Any], list[Any], asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None

    async def call(self, script: AsyncScript, keys: list[Any], args: list[Any]) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((script, keys, args, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # let the callers that are ready this tick join the batch
        while self._queue:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            pipe = self.redis.pipeline(transaction=False)
            for script, keys, args, _ in batch:  # EVALSHA only: no SCRIPT EXISTS round trip per batch
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            try:
                results = await pipe.execute(raise_on_error=False)
            except Exception as exc:  # connection lost: every caller of this batch sees it
                results = [exc] * len(batch)
            for (script, keys, args, future), result in zip(batch, results, strict=True):
                if isinstance(result, NoScriptError):  # first use on this server: load it, run alone
                    try:
                        result = await script(keys=keys, args=args)
                    except Exception as exc:
                        result = exc
                if future.cancelled():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)
