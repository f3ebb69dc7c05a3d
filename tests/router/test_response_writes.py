"""A response of known length leaves the router in one write, head and body together
(`connections.HeadWithBody`); streamed heads, HEAD answers and a failure mid-answer are written as
uvicorn writes them. Driven through uvicorn's own request cycle; `Recorded` stands in for the socket's
transport and keeps each write."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from slimeish.router.connections import HeadWithBody


class Recorded:
    """The transport of one connection: what was written, in order, and whether it was closed."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def cycle(method: str = "POST") -> tuple[RequestResponseCycle, Recorded]:
    sock = Recorded()
    scope: Any = {"type": "http", "method": method, "path": "/", "http_version": "1.1", "headers": []}
    c = RequestResponseCycle(
        scope=scope,
        transport=sock,  # type: ignore[arg-type]
        flow=FlowControl(sock),  # type: ignore[arg-type]
        logger=None,  # type: ignore[arg-type]
        access_logger=None,  # type: ignore[arg-type]
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )
    c.transport = HeadWithBody(sock, c)  # type: ignore[arg-type]
    return c, sock


def start(length: int | None) -> Any:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http.response.start", "status": 200, "headers": headers}


def test_a_sized_answer_is_one_write_and_a_later_part_its_own():
    async def main() -> None:
        c, sock = cycle()
        await c.send(start(6))
        assert sock.writes == []  # the head waits for its body
        await c.send({"type": "http.response.body", "body": b'{"a":', "more_body": True})
        assert len(sock.writes) == 1
        assert sock.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
        assert sock.writes[0].endswith(b"\r\n\r\n" + b'{"a":')
        await c.send({"type": "http.response.body", "body": b"1"})
        assert sock.writes[1:] == [b"1"] and c.response_complete and not sock.closed

    asyncio.run(main())


def test_a_streamed_head_and_a_head_answer_go_out_at_once():
    async def main() -> None:
        streamed, sock = cycle()
        await streamed.send(start(None))  # chunked: events may come much later
        assert len(sock.writes) == 1 and b"transfer-encoding: chunked" in sock.writes[0]
        head, sock = cycle("HEAD")
        await head.send(start(6))
        assert len(sock.writes) == 1 and sock.writes[0].startswith(b"HTTP/1.1 200 OK")
        await head.send({"type": "http.response.body", "body": b""})
        assert len(sock.writes) == 1 and head.response_complete

    asyncio.run(main())


def test_a_held_head_is_written_before_the_connection_closes():
    async def main() -> None:
        c, sock = cycle()
        await c.send(start(6))
        c.transport.close()  # what uvicorn does when the app fails after starting its answer
        assert len(sock.writes) == 1 and sock.writes[0].startswith(b"HTTP/1.1 200 OK") and sock.closed

    asyncio.run(main())


def test_an_answered_cycle_is_freed_without_the_collector():
    """The cycle holds its `HeadWithBody` and not the other way round: a request's cycle, scope and
    headers go when the request does, not at the collector's next pass (a pause for every request
    in flight)."""

    async def main() -> None:
        c, sock = cycle()
        await c.send(start(2))
        await c.send({"type": "http.response.body", "body": b"{}"})
        assert len(sock.writes) == 1
        freed = weakref.ref(c)
        del c
        assert freed() is None

    gc.disable()
    try:
        asyncio.run(main())
    finally:
        gc.enable()
