"""Connection hygiene uvicorn leaves open: a deadline for each request's head, and caps on open
connections in total and per client address.

uvicorn closes a connection only when it idles after a response (`timeout_keep_alive`); one that
opens and never completes its request line and headers (a slowloris, or an idle socket) is kept
forever. `GuardedProtocol` is uvicorn's httptools protocol with a deadline: the head must be
complete `header_timeout` seconds after the connection opened, or after the first byte of a later
request on it, else the connection is closed. The body has its own deadline, set in the ASGI app
(`limits.capped`), where a 408 can still be answered.

The caps count connections, not requests (uvicorn's `limit_concurrency` counts both and answers
503 to a request on an already open, kept-alive connection once idle sockets fill it): a
connection opened beyond a cap is answered 503 `too_many_connections` with `Connection: close` to
its first request, and closed; the connections already open are served as before.

Each response of known length goes out in one write, head and body together (`HeadWithBody`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

log = logging.getLogger(__name__)

# A refused connection is logged at most this often (a flood would otherwise flood the log too).
_REFUSAL_LOG_EVERY_S = 10.0


@dataclass
class ConnectionCaps:
    """The open connections of one server, shared by its protocol instances; 0 = no cap."""

    total: int
    per_client: int
    open: Counter[str] = field(default_factory=Counter)
    refused: int = 0  # since the last log line
    _logged_at: float = float("-inf")

    def admit(self, client: str) -> str | None:
        """Count a new connection from `client` in, or say why it is refused."""
        if self.total and self.open.total() >= self.total:
            why = f"the router has {self.total} connections open, its limit (--max-connections)"
        elif self.per_client and self.open[client] >= self.per_client:
            why = f"{client} has {self.per_client} connections open, the limit per client"
            why += " (--max-connections-per-client)"
        else:
            self.open[client] += 1
            return None
        self._log_refusal(why)
        return why

    def release(self, client: str) -> None:
        self.open[client] -= 1
        if not self.open[client]:
            del self.open[client]

    def _log_refusal(self, why: str) -> None:
        self.refused += 1
        if (now := time.monotonic()) - self._logged_at >= _REFUSAL_LOG_EVERY_S:
            log.warning("refused %d connection(s) in %.0f s: %s", self.refused, _REFUSAL_LOG_EVERY_S, why)
            self.refused, self._logged_at = 0, now


def _refusal(why: str) -> Any:
    """An ASGI app answering every request 503 with `why`, in the OpenAI error shape, then closing."""
    body = orjson.dumps({"error": {"message": why, "type": "service_unavailable", "code": "too_many_connections"}})

    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"), (b"retry-after", b"1")]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return refuse


class HeadWithBody:
    """The transport as one request's response cycle sees it. uvicorn writes a response's head and
    its body apart: two system calls per answer, and two deliveries the client wakes for, which on
    loopback cost the router more CPU than anything else in a turn (docs/benchmarks.md). The head of
    a response with a body of known length is held here and written with the body's first part;
    every other write (a chunked stream's head, `100 Continue`, an error page) goes out as before.

    The cycle is held weakly: it holds this object as its transport, and a strong reference back
    would make every request's cycle, scope and headers cyclic garbage that only the collector
    frees (~14 objects a turn, bench/router_profile.py's "cyclic garbage per req")."""

    __slots__ = ("cycle", "first", "head", "transport")

    def __init__(self, transport: asyncio.Transport, cycle: RequestResponseCycle) -> None:
        self.transport, self.cycle = transport, weakref.ref(cycle)
        self.head: bytes | None = None
        self.first = True

    def write(self, data: bytes) -> None:
        first, self.first = self.first, False
        cycle = self.cycle()  # alive: only the cycle writes through this object
        if (
            first
            and cycle is not None
            and cycle.response_started
            and cycle.chunked_encoding is False
            and cycle.expected_content_length
            and cycle.scope["method"] != "HEAD"
        ):
            self.head = data  # the head: its body follows in the cycle's next write
            return
        if self.head is not None:
            data, self.head = self.head + data, None
        self.transport.write(data)

    def close(self) -> None:
        """Closed before the body came (the app failed mid-answer): the head goes out first, as it did."""
        if self.head is not None:
            self.transport.write(self.head)
            self.head = None
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


class GuardedProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, header_timeout: float, caps: ConnectionCaps, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout, self.caps = header_timeout, caps
        self._head_deadline: asyncio.TimerHandle | None = None
        self._counted: str | None = None  # the client address this connection is counted under

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else ""
        if (why := self.caps.admit(address)) is None:
            self._counted = address
        else:
            self.app = _refusal(why)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_deadline is None:  # a later request on a kept-alive connection
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before and self.cycle is not None:  # a new request's cycle (not an upgrade)
            self.cycle.transport = HeadWithBody(self.transport, self.cycle)  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._counted is not None:
            self.caps.release(self._counted)
            self._counted = None
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._head_deadline = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if not self.transport.is_closing():
            self.transport.close()
