"""Serve a small FastAPI app on loopback in a thread, for tests whose HTTP peer is a stand-in.

Each test module that uses it says what its app stands in for (a router, an SGLang server);
`stand_in_fixtures` gives a conftest the fixtures for one, with its state kept in a `StandIn`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Self, TypeVar

import pytest
import uvicorn
from fastapi import FastAPI

from slimeish.common.procs import free_port


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


@dataclasses.dataclass
class StandIn:
    """What a test shares with its stand-in server: the URL it is served at and, in subclasses, fields
    with defaults for the scripted replies and the recorded requests."""

    url: str

    def clean(self) -> Self:
        """Every field but `url` back at its default: a clean record for the next test."""
        for f in dataclasses.fields(self):
            if f.name != "url":
                setattr(self, f.name, f.default if f.default_factory is dataclasses.MISSING else f.default_factory())
        return self


S = TypeVar("S", bound=StandIn)


def stand_in_fixtures(name: str, state_type: type[S], build_app: Callable[[S], FastAPI]) -> tuple[Any, Any]:
    """A conftest's two fixtures for one stand-in: `stand_in_<name>` serves `build_app(state)` on loopback
    once a test module (starting a server is the slow part); `name` gives each test that state, cleaned."""
    served_name = f"stand_in_{name}"

    @pytest.fixture(scope="module", name=served_name)
    def served() -> Iterator[S]:
        port = free_port()
        state = state_type(url=f"http://127.0.0.1:{port}")
        with serve_app(build_app(state), port=port):
            yield state

    @pytest.fixture(name=name)
    def clean(request: pytest.FixtureRequest) -> S:
        return request.getfixturevalue(served_name).clean()

    return served, clean
