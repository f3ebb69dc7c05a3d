"""Slow clients cannot hold a real `slimeish router` process's connections: one that trickles
its request head, or never sends one, is closed after --header-timeout; one that trickles its body
is answered 408 and closed after --body-timeout; others are served meanwhile. Bounds are generous
(tests never time): the assertion is that the connection is closed, not when."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from slimeish.common.procs import ManagedProcess, free_port, wait_http

GENEROUS_S = 60.0


@pytest.fixture(scope="module")
def router(tiny_model, engine_url, tmp_path_factory) -> Iterator[str]:
    port = free_port()
    args = ["router", "--model", str(tiny_model), "--engine", engine_url, "--port", str(port),
            "--header-timeout", "1", "--body-timeout", "2"]  # fmt: skip
    with ManagedProcess.slimeish(*args, log_path=tmp_path_factory.mktemp("slow") / "router.log") as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=120, proc=proc.proc)
        yield url


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


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)))


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
