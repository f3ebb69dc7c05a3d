"""The HTTP hop from the router to one engine: the clients, the failures told apart (not reached,
a dropped connection, an error answer, a timeout), and an answer read whole or as SGLang's stream.

/generate goes through `generate_client` (its CPU per request is a quarter of aiohttp's); the
engines' rare other calls (health, versions, weight updates) through aiohttp, whose pool costs
~0.08 ms per request where httpx's cost ~1.1 ms (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TypeVar

import aiohttp
import orjson

from slimeish.router.engine_api import Answer, GenerateReply
from slimeish.router.engines import Engine
from slimeish.router.generate_client import ConnectionDropped, EngineResponse, GenerateClient, HopError, NotConnected


class EngineRejected(ValueError):
    """The engine answered 4xx: the request itself is bad (an HTTP 400 for the client)."""


class EngineError(RuntimeError):
    """The engine failed this one request (5xx answer, timeout): 502/504 for the client, no retry."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


# A reachable engine accepts a connection in milliseconds; waiting the whole request timeout for a
# dead host would hold the request for minutes before it is retried elsewhere.
CONNECT_TIMEOUT = 10.0
HTTP_ERRORS = (aiohttp.ClientError, TimeoutError)  # the failures of an aiohttp call
GENERATE_ERRORS = (HopError, TimeoutError)  # those of a /generate
JSON = {"content-type": "application/json"}
# SGLang (and uvicorn by default) closes a connection idle for 5 s. Reusing one just as the engine
# closes it fails the request before the engine reads it, and ejects a healthy engine; so idle
# connections are dropped here first. Agents often pause longer than that between turns.
IDLE_CONNECTION_S = 4.0


def engine_client(idle_s: float = IDLE_CONNECTION_S) -> aiohttp.ClientSession:
    """The router's client for the engines' other calls (few connections: health checks, updates)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024, keepalive_timeout=idle_s))


def generate_client(idle_s: float = IDLE_CONNECTION_S) -> GenerateClient:
    """The router's client for /generate (many connections: one per concurrent turn)."""
    return GenerateClient(idle_s)


def dropped(e: BaseException) -> bool:
    """The engine took the connection and closed it before answering (not: could not connect)."""
    return isinstance(e, ConnectionDropped)


def unreachable(e: BaseException) -> bool:
    """The request never reached the engine: safe to retry elsewhere. A read timeout (a long
    generation: 504) and an answer cut short are not among them."""
    return isinstance(e, (NotConnected, ConnectionDropped))


async def _lines(response: EngineResponse) -> AsyncIterator[bytes]:
    """The body's lines, however long: SGLang's stream chunks are cumulative (every chunk repeats
    all ids and log-probs so far)."""
    pending, scanned = bytearray(), 0  # bytes before `scanned` hold no newline: never searched twice
    async for data in response.chunks():
        pending += data
        start = 0
        while (end := pending.find(b"\n", scanned)) >= 0:
            yield bytes(pending[start:end])
            start = scanned = end + 1
        del pending[:start]
        scanned = len(pending)
    if pending:
        yield bytes(pending)


def _check_status(engine: Engine, status: int, content: bytes) -> None:
    if status < 400:
        return
    text = content.decode(errors="replace")
    if status >= 500:
        raise EngineError(502, f"engine {engine.url} answered HTTP {status}: {text[:300]}")
    raise EngineRejected(f"engine rejected the request: {text[:500]}")


class EngineFailedMidStream(RuntimeError):
    """The engine failed after output was already sent to the client: no retry is possible."""


class GenerationAborted(RuntimeError):
    """The engine ended a generation with `finish_reason.type == "abort"` (a request aborted on it):
    the turn has no answer, streamed or not (an HTTP 503 for the client)."""


async def read_whole(engine: Engine, response: EngineResponse) -> AsyncGenerator[Answer, None]:
    """A non-streamed answer, as one item."""
    content = await response.read()
    _check_status(engine, response.status, content)
    yield orjson.loads(content)


async def read_chunks(engine: Engine, response: EngineResponse) -> AsyncGenerator[GenerateReply, None]:
    """A streamed answer's SGLang chunks (the `data:` lines of its server-sent events)."""
    if response.status >= 400:
        _check_status(engine, response.status, await response.read())
    async for raw in _lines(response):
        line = raw.strip()
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
            yield orjson.loads(line[5:])


Item = TypeVar("Item", Answer, GenerateReply)
# How `EnginePool._send` reads an engine's answer: whole, or chunk by chunk.
Reader = Callable[[Engine, EngineResponse], AsyncGenerator[Item, None]]
