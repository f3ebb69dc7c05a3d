"""Serve a small FastAPI app on loopback in a thread, for tests whose HTTP peer is a stand-in.

Each test module that uses it says what its app stands in for (a router, an SGLang server).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from slimeish.procs import free_port


@contextlib.contextmanager
def serve_app(app: FastAPI, port: int | None = None, startup_timeout: float = 10.0) -> Iterator[str]:
    """Run `app` on 127.0.0.1:`port` (default: a free one) until the block ends; yields its URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"stand-in server on port {port} did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)
