"""Connection hygiene uvicorn leaves open: a deadline for each request's head.

uvicorn closes a connection only when it idles after a response (`timeout_keep_alive`); one that
opens and never completes its request line and headers (a slowloris, or an idle socket) is kept
forever. `HeadDeadlineProtocol` is uvicorn's httptools protocol with a deadline: the head must be
complete `header_timeout` seconds after the connection opened, or after the first byte of a later
request on it, else the connection is closed. The body has its own deadline, set in the ASGI app
(`limits.capped`), where a 408 can still be answered.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeadDeadlineProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_deadline is None:  # a later request on a kept-alive connection
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
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
