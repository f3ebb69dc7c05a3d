"""Fixtures for buffer tests: one real valkey-server per test session, a fresh run per test.

Each test gets its own run id (so key names never collide) and its run's keys are deleted
afterwards; the server and its data directory go away at the end of the session.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.buffer.keys import PREFIX


@pytest.fixture(scope="session")
def valkey(tmp_path_factory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("valkey")) as server:
        yield server


@pytest.fixture
def run_id(valkey: EmbeddedServer) -> Iterator[str]:
    rid = f"test-{uuid.uuid4().hex[:12]}"
    yield rid
    client = redis.Redis.from_url(valkey.url)
    keys = list(client.scan_iter(match=f"{PREFIX}:{rid}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
async def buf(valkey: EmbeddedServer, run_id: str) -> AsyncIterator[Buffer]:
    async with Buffer(valkey.url, run_id) as b:
        yield b
