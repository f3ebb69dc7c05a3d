"""Aborting a session against a real valkey-server: an episode lost to its infrastructure gives
its group place back, and the member is generated again in the same group at the same index."""

from __future__ import annotations

import pytest

from slimeish.buffer import Buffer, SessionFinishedError, SessionInfo, UnknownSessionError
from tests.buffer.buffer_helpers import turn, write_session


async def test_an_aborted_session_frees_its_place_for_the_member_generated_again(buf: Buffer):
    await write_session(buf, "g", 0, 2, reward=1.0)
    await buf.open_session(SessionInfo("g-1", "g", 1, 2, {"prompt": "p-g"}))
    await buf.append_turn(turn("g-1", 0))  # the lost episode's first turn was captured

    assert await buf.abort_session("g-1")
    (view,) = await buf.groups(["g"])
    assert (view.state, view.members) == ("open", [(0, "g-0")])  # place 1 is free
    stored = await buf.redis.hmget(buf.keys.session("g-1"), ["status", "finished_at", "retired_at"])
    assert stored[0] == b"aborted" and stored[1] is not None and stored[2] is not None
    stats = await buf.stats()
    assert (stats.sessions_open, stats.sessions_finished, stats.sessions_failed) == (0, 2, 0)

    await buf.open_session(SessionInfo("g-1-again", "g", 1, 2, {"prompt": "p-g"}))
    await buf.append_turn(turn("g-1-again", 0))
    await buf.finish_session("g-1-again", 0.5, "completed")
    (group,) = (await buf.take_groups(1, "t")).groups
    assert [(s.session_id, s.reward) for s in group.samples] == [("g-0", 1.0), ("g-1-again", 0.5)]
    counters = await buf.counters()
    assert (counters["sessions_open"], counters["sessions_finished"], counters["groups_completed"]) == (0, 3, 1)


async def test_abort_is_idempotent_and_refuses_a_session_that_is_not_open(buf: Buffer):
    await buf.open_session(SessionInfo("g-0", "g", 0, 2))
    assert await buf.abort_session("g-0")
    counters = await buf.counters()
    assert not await buf.abort_session("g-0")  # a retry: nothing changes
    assert await buf.counters() == counters

    finished = await write_session(buf, "g", 1, 2, reward=None)  # finished, its reward still to come
    counters = await buf.counters()
    assert not await buf.abort_session(finished)
    assert await buf.redis.hget(buf.keys.session(finished), "status") == b"completed"
    (view,) = await buf.groups(["g"])
    assert view.members == [(1, finished)]
    assert await buf.counters() == counters

    with pytest.raises(UnknownSessionError):
        await buf.abort_session("never-opened")


async def test_an_aborted_session_takes_no_more_turns_and_no_finish(buf: Buffer):
    await buf.open_session(SessionInfo("g-0", "g", 0, 1))
    await buf.append_turn(turn("g-0", 0))
    assert await buf.abort_session("g-0")
    with pytest.raises(SessionFinishedError):  # a turn the lost worker's agent still sent
        await buf.append_turn(turn("g-0", 1, prompt=[1, 2, 3, 4, 5], out=[6]))
    with pytest.raises(SessionFinishedError):
        await buf.finish_session("g-0", 1.0, "completed")
    (view,) = await buf.groups(["g"])
    assert (view.state, view.members) == ("open", [])


async def test_abort_leaves_a_place_that_recovery_already_freed(buf: Buffer):
    await buf.open_session(SessionInfo("g-0", "g", 0, 1, {"prompt": "p"}, owner="router0"))
    (request,) = await buf.recover_open_groups(owner="router0")  # the router restarted first
    assert request.indices == [0]
    counters = await buf.counters()
    assert not await buf.abort_session("g-0")
    assert await buf.counters() == counters
