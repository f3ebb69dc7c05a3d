"""Slow clients cannot hold a real `slimeish router` process's connections: one that trickles
its request head, or never sends one, is closed after --header-timeout; one that trickles its body
is answered 408 and closed after --body-timeout; an idle kept-alive one is closed after
--timeout-keep-alive; connections beyond --max-connections (in total) or
--max-connections-per-client (from one address) are answered 503 and closed while those open are
served on; others are served meanwhile. Bounds are generous (tests never time): the assertion is
that the connection is closed, not when."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from slimeish.common.procs import ManagedProcess, free_port, wait_http

GENEROUS_S = 60.0


def serve(tiny_model: Path, engine_url: str, log_dir: Path, *flags: str) -> Iterator[str]:
    port = free_port()
    args = ["router", "--model", str(tiny_model), "--engine", engine_url, "--port", str(port), *flags]
    with ManagedProcess.slimeish(*args, log_path=log_dir / "router.log") as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=120, proc=proc.proc)
        yield url


@pytest.fixture(scope="module")
def router(tiny_model, engine_url, tmp_path_factory) -> Iterator[str]:
    yield from serve(tiny_model, engine_url, tmp_path_factory.mktemp("slow"), "--header-timeout", "1",
                     "--body-timeout", "2")  # fmt: skip


@pytest.fixture(scope="module")
def capped_router(tiny_model, engine_url, tmp_path_factory) -> Iterator[str]:
    """Idle sockets keep their places here (a long --header-timeout): the caps are what refuses."""
    flags = ["--header-timeout", "600", "--timeout-keep-alive", "1"]
    flags += ["--max-connections", "4", "--max-connections-per-client", "2"]
    yield from serve(tiny_model, engine_url, tmp_path_factory.mktemp("capped"), *flags)


def trickle(sock: socket.socket, data: bytes, stop: threading.Event) -> None:
    """Send `data` a byte every 0.2 s until the router closes the connection (or `stop`)."""
    for byte in data:
        if stop.wait(0.2):
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return


def read_until_closed(sock: socket.socket) -> bytes:
    """What the router sent before closing; fails if it keeps the connection past the bound."""
    sock.settimeout(GENEROUS_S)
    received = b""
    deadline = time.monotonic() + GENEROUS_S
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    pytest.fail("the router kept the slow connection open")


def connect(url: str, source: str = "127.0.0.1") -> socket.socket:
    """A connection to the router from `source` (any 127.x.y.z address is this machine's loopback)."""
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), source_address=(source, 0))


GET_HEALTH = b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n"


def get_health(url: str, source: str) -> bytes:
    """The router's whole answer to GET /health sent from `source` on a new connection, kept alive
    until the router closes it."""
    with connect(url, source) as sock:
        sock.sendall(GET_HEALTH)
        return read_until_closed(sock)


def served_once_released(url: str, source: str) -> bytes:
    """GET /health from `source` once the router has counted closed connections out (it learns of
    a client's close asynchronously); its answer."""
    deadline = time.monotonic() + GENEROUS_S
    while b" 503 " in (answer := get_health(url, source)).partition(b"\r\n")[0] and time.monotonic() < deadline:
        time.sleep(0.2)
    return answer


HEAD = b"POST /sessions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n"


@pytest.mark.parametrize("sent", [b"", HEAD[:20]], ids=["idle", "trickling-head"])
def test_a_connection_without_its_request_head_is_closed(router, sent):
    stop = threading.Event()
    with connect(router) as sock:
        threading.Thread(target=trickle, args=(sock, HEAD if sent else b"", stop), daemon=True).start()
        try:
            assert httpx.get(router + "/health").status_code == 200  # others are served meanwhile
            assert read_until_closed(sock) == b""  # closed, with nothing to answer
        finally:
            stop.set()


def test_a_trickling_body_is_answered_408_and_closed(router):
    stop = threading.Event()
    with connect(router) as sock:
        sock.sendall(HEAD)
        threading.Thread(target=trickle, args=(sock, b"{" + b" " * 198 + b"}", stop), daemon=True).start()
        try:
            assert httpx.get(router + "/health").status_code == 200
            answer = read_until_closed(sock)
        finally:
            stop.set()
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"--body-timeout" in answer and b"request_timeout" in answer


def test_connections_beyond_the_caps_are_answered_503_while_those_open_are_served(capped_router):
    # two idle connections from 127.0.0.2: its per-client cap
    idle = [connect(capped_router, "127.0.0.2") for _ in range(2)]
    try:
        refused = get_health(capped_router, "127.0.0.2")
        assert refused.startswith(b"HTTP/1.1 503 "), refused
        assert b"too_many_connections" in refused and b"--max-connections-per-client" in refused
        # another address is served: two places of the total's four are free
        with connect(capped_router, "127.0.0.3") as held:
            answer = get_health(capped_router, "127.0.0.4")
            assert answer.startswith(b"HTTP/1.1 200 "), answer
            # the fourth place taken, a fifth connection is over the total
            idle.append(connect(capped_router, "127.0.0.5"))
            refused = get_health(capped_router, "127.0.0.4")
            assert refused.startswith(b"HTTP/1.1 503 ") and b"(--max-connections)" in refused, refused
            # a connection that was open before the cap filled is still served
            held.sendall(GET_HEALTH)
            assert read_until_closed(held).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in idle:
            sock.close()
    # closed connections free their places
    assert served_once_released(capped_router, "127.0.0.2").startswith(b"HTTP/1.1 200 ")


def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(capped_router):
    with connect(capped_router) as sock:
        sock.sendall(GET_HEALTH)
        # the answer, then nothing more: the router closes the connection itself (--timeout-keep-alive 1)
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1") == 1, answer
