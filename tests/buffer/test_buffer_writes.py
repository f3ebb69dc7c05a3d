"""Writes against a real valkey-server: sessions, turns, sealing, rewards, retries, bad input."""

from __future__ import annotations

from dataclasses import replace

import pytest
import redis

from slimeish.buffer import (
    Buffer,
    BufferInputError,
    ConflictError,
    SessionFinishedError,
    SessionInfo,
    UnknownSessionError,
)
from slimeish.buffer.keys import PREFIX
from tests.buffer.buffer_helpers import turn, write_session


def snapshot(url: str, run_id: str) -> dict[bytes, bytes]:
    """Every key of the run with its serialized value, to prove a refused call changed nothing."""
    client = redis.Redis.from_url(url)
    try:
        return {k: client.dump(k) for k in sorted(client.scan_iter(match=f"{PREFIX}:{run_id}:*"))}
    finally:
        client.close()


async def test_finish_seals_samples_and_completes_the_group(buf: Buffer):
    await buf.open_session(SessionInfo("a", "g", 0, 2, {"prompt": "2+2"}))
    await buf.open_session(SessionInfo("b", "g", 1, 2))
    await buf.append_turn(turn("a", 0, version=3))
    await buf.append_turn(turn("a", 1, prompt=[9], out=[8], version=4))
    assert await buf.finish_session("a", 1.0, "completed", {"answer": 4}) is True
    (sample,) = await buf.session_samples("a")
    assert sample.tokens == [1, 2, 3, 4, 5, 9, 8] and sample.loss_mask == [1, 1, 0, 1]
    assert sample.weight_versions == [3, 4] and sample.reward == 1.0
    assert sample.metadata == {"prompt": "2+2", "answer": 4, "group_id": "g"}
    assert (await buf.stats()).groups_open == 1  # b is still running
    await buf.append_turn(turn("b", 0))
    await buf.finish_session("b", 0.0, "truncated")
    stats = await buf.stats()
    assert (stats.groups_open, stats.groups_waiting, stats.sessions_finished) == (0, 1, 2)
    stored = await buf.session_samples("a")
    assert stored[0].tokens == sample.tokens and stored[0].reward == 1.0


async def test_the_tool_parse_outcome_is_stored_with_the_turn_and_on_the_sample(buf: Buffer):
    await buf.open_session(SessionInfo("a", "g", 0, 1))
    await buf.append_turn(replace(turn("a", 0), tool_calls=1))
    await buf.append_turn(replace(turn("a", 1, prompt=[9]), parse_failure="malformed"))
    with pytest.raises(ConflictError):  # the same turn with another outcome is another turn
        await buf.append_turn(replace(turn("a", 1, prompt=[9]), parse_failure="truncated"))
    await buf.finish_session("a", 1.0)
    assert [(t.parse_failure, t.tool_calls) for t in await buf.turns("a")] == [(None, 1), ("malformed", 0)]
    (sample,) = await buf.session_samples("a")
    assert sample.metadata["tool_parse"] == {"calls": 1, "failures": {"malformed": 1}}


async def test_retried_writes_are_stored_once(buf: Buffer, valkey, run_id):
    info = SessionInfo("a", "g", 0, 1)
    assert await buf.open_session(info) is True
    assert await buf.open_session(info) is False
    assert await buf.append_turn(turn("a", 0)) is True
    assert await buf.append_turn(turn("a", 0)) is False
    assert await buf.finish_session("a", 1.0) is True
    before = snapshot(valkey.url, run_id)
    assert await buf.finish_session("a", 1.0) is False
    assert snapshot(valkey.url, run_id) == before
    assert (await buf.stats()).groups_waiting == 1


async def test_reward_can_come_after_finish(buf: Buffer):
    await write_session(buf, "g", 0, 2, reward=None)
    await write_session(buf, "g", 1, 2, reward=1.0)
    assert (await buf.stats()).groups_waiting == 0  # member 0 has no reward yet
    assert await buf.set_reward("g-0", 0.5) is True
    assert await buf.set_reward("g-0", 0.5) is False
    with pytest.raises(ConflictError, match="already has reward"):
        await buf.set_reward("g-0", 0.7)
    assert (await buf.stats()).groups_waiting == 1
    assert (await buf.session_samples("g-0"))[0].reward == 0.5


async def test_failed_session_completes_its_group_without_samples(buf: Buffer):
    await write_session(buf, "g", 0, 2)
    await buf.open_session(SessionInfo("g-1", "g", 1, 2))
    await buf.fail_session("g-1", "agent crashed")
    stats = await buf.stats()
    assert (stats.sessions_failed, stats.groups_waiting) == (1, 1)
    assert await buf.session_samples("g-1") == []


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda b: b.append_turn(turn("nope", 0)), UnknownSessionError, "unknown session"),
        (lambda b: b.finish_session("nope", 1.0), UnknownSessionError, "unknown session"),
        (lambda b: b.append_turn(turn("a", 1)), SessionFinishedError, "is completed"),
        (lambda b: b.finish_session("a", 0.0), SessionFinishedError, "already completed"),
        (lambda b: b.open_session(SessionInfo("x", "g", 0, 2)), ConflictError, "taken by session g-0"),
        (lambda b: b.open_session(SessionInfo("x", "g", 1, 3)), ConflictError, "has size 2"),
        (lambda b: b.open_session(SessionInfo("x", "g", 2, 2)), BufferInputError, "index < group_size"),
        (lambda b: b.finish_session("b", float("nan")), BufferInputError, "finite"),
        (lambda b: b.finish_session("b", {"accuracy": 1.0}), BufferInputError, "finite number"),
        (lambda b: b.finish_session("b", 1.0, "pending"), BufferInputError, "final status"),
        (lambda b: b.append_turn(turn("b", 0, out=[7])), ConflictError, "other content"),
        (lambda b: b.append_turn(turn("b", 2)), BufferInputError, "never appended"),
        (lambda b: b.append_turn(turn("b", 1, seg=2)), BufferInputError, "segment_index 2"),
        (lambda b: b.set_reward("b", 1.0), BufferInputError, "needs a finished session"),
    ],
)
async def test_bad_input_is_refused_and_changes_nothing(buf: Buffer, valkey, run_id, call, error, message):
    await write_session(buf, "g", 0, 2)  # session "g-0" is finished
    await buf.open_session(SessionInfo("a", "h", 0, 1))
    await buf.append_turn(turn("a", 0))
    await buf.finish_session("a", 1.0)
    await buf.open_session(SessionInfo("b", "g", 1, 2))
    await buf.append_turn(turn("b", 0))
    before = snapshot(valkey.url, run_id)
    with pytest.raises(error, match=message):
        await call(buf)
    assert snapshot(valkey.url, run_id) == before


async def test_turns_written_by_another_process_are_sealed(valkey, run_id):
    async with Buffer(valkey.url, run_id) as router_a, Buffer(valkey.url, run_id) as router_b:
        await router_a.open_session(SessionInfo("a", "g", 0, 1))
        await router_a.append_turn(turn("a", 0))
        await router_b.append_turn(turn("a", 1, prompt=[6]))  # router_b never saw turn 0
        await router_a.finish_session("a", 1.0)
        (sample,) = await router_a.session_samples("a")
    assert sample.tokens == [1, 2, 3, 4, 5, 6, 4, 5]


async def test_interleaved_lineages_from_two_processes_are_one_sample_each(valkey, run_id):
    """A sub-agent's turns (lineage 1) interleave with the main agent's: each continues its own
    segment, whichever process wrote the turns before it."""
    async with Buffer(valkey.url, run_id) as router_a, Buffer(valkey.url, run_id) as router_b:
        await router_a.open_session(SessionInfo("a", "g", 0, 1))
        await router_a.append_turn(turn("a", 0))
        await router_a.append_turn(replace(turn("a", 1, seg=1, prompt=[7], split_reason="new_conversation"), lineage=1))
        await router_b.append_turn(turn("a", 2, prompt=[8]))  # back to segment 0
        await router_a.append_turn(replace(turn("a", 3, seg=1, prompt=[9]), lineage=1))
        with pytest.raises(BufferInputError, match="segment_index 3"):
            await router_b.append_turn(turn("a", 4, seg=3, prompt=[1]))
        await router_a.finish_session("a", 1.0)
        main, sub = await router_a.session_samples("a")
    assert (main.tokens, sub.tokens) == ([1, 2, 3, 4, 5, 8, 4, 5], [7, 4, 5, 9, 4, 5])
    assert (main.metadata["lineage"], sub.metadata["lineage"]) == (0, 1)
