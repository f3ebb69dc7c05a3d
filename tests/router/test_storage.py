"""`MemoryStore`: bounded like the router's finished-session summaries."""

from __future__ import annotations

import pytest

from slimeish.buffer import SessionInfo
from slimeish.common.sample import Status
from slimeish.router.storage import MemoryStore


async def test_memory_store_keeps_only_the_latest_finished_sessions():
    store = MemoryStore(keep_finished=2)
    ids = [f"sess_{i}" for i in range(4)]
    for i, session_id in enumerate(ids):
        await store.open_session(SessionInfo(session_id, "g", i, 4, {}, True))
    for session_id in ids[:3]:
        await store.finish_session(session_id, 1.0, Status.COMPLETED, {})
    assert list(store.finished) == ids[1:3]
    assert set(store.sessions) == set(store.turns) == set(ids[1:])  # the open one stays
    with pytest.raises(KeyError):
        store.samples(ids[0])
