"""The router's HTTP/1.1 client for the engines' /generate, the one call every turn makes.

aiohttp's client spends ~330 us of CPU per request on this hop, a bare asyncio protocol with
httptools' parser (uvicorn's) ~75 (bench/engine_hop_cpu.py): at 256 agents that is most of the
router's own time per turn. So the hop keeps only what it needs: connections kept alive per engine
and dropped once idle for `idle_s`, a connect timeout and a timeout on each read, the request
written at once, the answer read whole or as it arrives, and its failures told apart:
`NotConnected` and `ConnectionDropped` (the engine never read the request: safe to retry),
`TimeoutError` (no byte within the read timeout) and `AnswerCut` (it ended mid-answer). The
engines' other calls (health, versions, weight updates) are rare and stay on aiohttp.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from types import TracebackType
from typing import cast
from urllib.parse import urlsplit

import httptools


class HopError(ConnectionError):
    """The hop to an engine failed below HTTP."""


class NotConnected(HopError):
    """No connection to the engine (refused, unresolvable, or none within the connect timeout)."""


class ConnectionDropped(HopError):
    """The engine closed the connection before any byte of an answer (most often a kept-alive
    one it was closing just then)."""


class AnswerCut(HopError):
    """The connection ended, or the answer stopped being HTTP, in the middle of an answer."""


class _Connection(asyncio.Protocol):
    """One connection to an engine, one exchange at a time; httptools calls the `on_*` methods."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.lost = False
        self.idle_since = 0.0
        self.reset()

    def reset(self) -> None:
        self.answered = self.has_head = self.complete = self.keep_alive = False
        self.status = 0
        self.body: list[bytes] = []
        self.broken: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass of it

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self.broken = f"the answer is not HTTP/1.1: {e}"
            self.close()
        self._wake()

    def on_headers_complete(self) -> None:
        self.status, self.has_head = self.parser.get_status_code(), True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete, self.keep_alive = True, self.parser.should_keep_alive()  # not known after

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def more(self, timeout: float) -> None:
        """Wait for the next bytes of the answer (at most `timeout` s: then TimeoutError)."""
        if self.broken or self.lost:
            if not self.answered:
                raise ConnectionDropped("the engine closed the connection before answering")
            raise AnswerCut(self.broken or "the engine closed the connection mid-answer")
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await self.waiter
        finally:
            self.waiter = None

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class _Engine:
    """Where one engine URL's requests go, and its idle connections (the last used on top)."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.host = parts.hostname or ""
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.port = parts.port or (443 if self.ssl else 80)
        self.prefix, self.netloc = parts.path.rstrip("/"), parts.netloc
        self.idle: list[_Connection] = []


class EngineResponse:
    """One POST's answer: `status` once entered, then `read()` or `chunks()`. Leaving the block
    puts a connection whose answer was read whole back for reuse and closes any other one (an
    engine whose stream is left unread stops generating)."""

    def __init__(self, client: GenerateClient, url: str, target: bytes, body: bytes, timeouts: tuple[float, float]):
        self._client, self._url, self._target, self._body = client, url, target, body
        self._connect_timeout, self._read_timeout = timeouts
        self._conn: _Connection | None = None
        self.status = 0

    async def __aenter__(self) -> EngineResponse:
        engine = self._client.engine(self._url)
        self._conn = conn = await self._client.connection(engine, self._connect_timeout)
        assert conn.transport is not None
        head = b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        conn.transport.writelines([head % (self._target, engine.netloc.encode(), len(self._body)), self._body])
        while not conn.has_head:
            await conn.more(self._read_timeout)
        self.status = conn.status
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if (conn := self._conn) is not None:
            self._client.release(self._url, conn)

    async def read(self) -> bytes:
        conn = self._connection()
        while not conn.complete:
            await conn.more(self._read_timeout)
        return b"".join(conn.body)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, in the pieces it arrives in."""
        conn = self._connection()
        while True:
            if conn.body:
                pieces, conn.body = conn.body, []
                for piece in pieces:
                    yield piece
            elif conn.complete:
                return
            else:
                await conn.more(self._read_timeout)

    def _connection(self) -> _Connection:
        assert self._conn is not None, "read inside `async with`"
        return self._conn


class GenerateClient:
    """Kept-alive connections to each engine. `idle_s` must be under the engines' own idle limit
    (SGLang's 5 s): a connection reused just as the engine closes it fails the request."""

    def __init__(self, idle_s: float):
        self.idle_s = idle_s
        self._engines: dict[str, _Engine] = {}

    def post(self, url: str, path: str, body: bytes, connect_timeout: float, read_timeout: float) -> EngineResponse:
        """POST JSON `body` to `url` + `path`: `async with client.post(...) as response`."""
        target = (self.engine(url).prefix + path).encode()
        return EngineResponse(self, url, target, body, (connect_timeout, read_timeout))

    def engine(self, url: str) -> _Engine:
        if (engine := self._engines.get(url)) is None:
            engine = self._engines[url] = _Engine(url)
        return engine

    async def connection(self, engine: _Engine, timeout: float) -> _Connection:
        """The engine's most recently used idle connection, or a new one. Older idle ones that
        outlived `idle_s` or were closed by the engine are dropped as they come up."""
        loop = asyncio.get_running_loop()
        while engine.idle:
            conn = engine.idle.pop()
            if not conn.lost and loop.time() - conn.idle_since < self.idle_s:
                return conn
            conn.close()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(_Connection, engine.host, engine.port, ssl=engine.ssl)
        except OSError as e:  # refused, unresolvable, TLS, or the timeout (a TimeoutError)
            raise NotConnected(f"cannot connect to {engine.netloc}: {e!r}") from e
        return conn

    def release(self, url: str, conn: _Connection) -> None:
        if conn.keep_alive and not conn.lost:
            conn.reset()
            conn.idle_since = asyncio.get_running_loop().time()
            self.engine(url).idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for engine in self._engines.values():
            for conn in engine.idle:
                conn.close()
            engine.idle.clear()
