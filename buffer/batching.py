"""Automatic pipelining of script calls: concurrent writers share round trips.

A router writes for many sessions at once; awaiting each Lua script call alone costs a round
trip and a connection checkout apiece. Calls made in the same event-loop tick go out together
in one pipeline (non-transactional: each script stays atomic on its own, and each caller gets
its own result or error). Batches are small (`max_batch`) and do not wait for each other: the
server reads each connection in ~16 KB steps and, with `appendfsync always`, fsyncs once per
event-loop turn, so a few pipelines on parallel connections share an fsync better than one big
pipeline, which is read (and fsynced) over many turns.

`run` is the typed way in: a `LuaScript` with its own named keys and arguments; a script's
error reply comes back as the buffer's exception for its code (errors.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from slimeish.buffer.errors import from_script_error
from slimeish.buffer.scripts import A, K, LuaScript, spread

_Call = tuple[AsyncScript, list[str], list[Any], "asyncio.Future[Any]"]


class ScriptBatcher:
    def __init__(self, redis: Redis, max_batch: int = 8) -> None:
        self.redis = redis
        self.max_batch = max_batch
        self._queue: list[_Call] = []
        self._scheduled = False
        self._in_flight: set[asyncio.Task[None]] = set()  # strong references until each batch is done
        self._registered: dict[str, AsyncScript] = {}  # by source: each script's SHA, computed once

    async def run(self, script: LuaScript[K, A], keys: K, args: A) -> Any:
        """The script's reply (an int or a list, as its Lua returns)."""
        registered = self._registered.get(script.source)
        if registered is None:
            registered = self._registered[script.source] = self.redis.register_script(script.source)
        try:
            return await self._call(registered, spread(keys), spread(args))
        except ResponseError as exc:
            raise from_script_error(str(exc)) or exc from None

    async def _call(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((script, keys, args, future))
        if not self._scheduled:  # send after the callers that are ready this tick have queued theirs
            self._scheduled = True
            loop.call_soon(self._send)
        return await future

    def _send(self) -> None:
        self._scheduled = False
        queue, self._queue = self._queue, []
        for start in range(0, len(queue), self.max_batch):
            task = asyncio.get_running_loop().create_task(self._execute(queue[start : start + self.max_batch]))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def _execute(self, batch: list[_Call]) -> None:
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
