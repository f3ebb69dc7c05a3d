"""Taking groups against a real valkey-server: ack/give_back, recovery, staleness, policies, filter."""

from __future__ import annotations

import pytest

from slimeish.buffer import Buffer, BufferConfig, ConflictError, NotTakenError, SessionInfo, UnknownGroupError
from tests.buffer.buffer_helpers import turn, write_group, write_session


async def test_take_ack_and_never_again(buf: Buffer, valkey, run_id):
    await write_group(buf, "g1", 2)
    await write_group(buf, "g2", 3)
    groups = (await buf.take_groups(5, "trainer", current_version=0)).groups
    assert [g.group_id for g in groups] == ["g1", "g2"]
    assert [s.index for s in groups[1].samples] == [0, 1, 2]
    assert [s.reward for s in groups[1].samples] == [0.0, 1.0, 2.0]
    assert groups[0].metadata == {"prompt": "p-g1"}
    assert (await buf.stats()).groups_taken == 2
    assert await buf.ack(["g1", "g2"]) == 2
    assert await buf.ack(["g1"]) == 0  # acknowledging twice is a no-op
    assert (await buf.take_groups(5, "trainer")).groups == []
    async with Buffer(valkey.url, run_id) as restarted:
        assert (await restarted.take_groups(5, "trainer")).groups == []  # acknowledged groups never come back
    stats = await buf.stats()
    assert (stats.groups_trained, stats.groups_taken, stats.groups_waiting) == (2, 0, 0)


async def test_take_respects_n_and_incomplete_groups_wait(buf: Buffer):
    for gid in ("a", "b", "c"):
        await write_group(buf, gid, 2)
    await write_session(buf, "open", 0, 2)
    first = (await buf.take_groups(2, "t")).groups
    second = (await buf.take_groups(2, "t")).groups
    assert [g.group_id for g in first + second] == ["a", "b", "c"]


async def test_unacknowledged_groups_come_back_to_a_restarted_consumer(buf: Buffer, valkey, run_id):
    await write_group(buf, "g1")
    await write_group(buf, "g2")
    await write_group(buf, "g3")
    taken = (await buf.take_groups(2, "trainer-0")).groups
    await buf.ack([taken[0].group_id])
    async with Buffer(valkey.url, run_id) as restarted:  # same consumer name, new process state
        again = (await restarted.take_groups(1, "trainer-0")).groups
        assert [g.group_id for g in again] == [taken[1].group_id]
        assert [g.group_id for g in (await restarted.take_groups(5, "trainer-0")).groups] == ["g3"]
        assert (await restarted.take_groups(5, "trainer-0")).groups == []


async def test_reclaim_from_a_consumer_with_another_name(buf: Buffer, valkey, run_id):
    await write_group(buf, "g1")
    assert len((await buf.take_groups(1, "dead-trainer")).groups) == 1
    async with Buffer(valkey.url, run_id, BufferConfig(reclaim_after_s=0)) as other:
        assert [g.group_id for g in (await other.take_groups(1, "new-trainer")).groups] == ["g1"]
        assert await other.ack(["g1"]) == 1


async def test_give_back_hands_the_group_out_again(buf: Buffer):
    await write_group(buf, "g1")
    (group,) = (await buf.take_groups(1, "t")).groups
    assert await buf.give_back([group.group_id]) == 1
    with pytest.raises(NotTakenError):
        await buf.give_back([group.group_id])
    (again,) = (await buf.take_groups(1, "other")).groups
    assert again.group_id == "g1" and (await buf.stats()).groups_given_back == 1


async def test_ack_of_a_group_not_handed_out_is_refused(buf: Buffer):
    await write_group(buf, "waiting")
    with pytest.raises(NotTakenError, match="not handed out"):
        await buf.ack(["waiting"])
    with pytest.raises(UnknownGroupError):
        await buf.ack(["no-such-group"])
    assert (await buf.stats()).groups_waiting == 1


async def test_ack_is_all_or_nothing(buf: Buffer):
    await write_group(buf, "g1")
    await buf.take_groups(1, "t")
    with pytest.raises(UnknownGroupError):
        await buf.ack(["g1", "typo"])
    stats = await buf.stats()
    assert (stats.groups_taken, stats.groups_trained) == (1, 0)
    assert await buf.ack(["g1"]) == 1


async def test_stale_members_are_regenerated_in_their_group(buf: Buffer, valkey, run_id):
    # Member 1 ran long: its token is fresh, its siblings' tokens aged while it ran.
    for index, version in enumerate((1, 4, 2)):
        await write_session(buf, "g", index, 3, reward=float(index), version=version)
    await write_group(buf, "fresh", version=4)
    async with Buffer(valkey.url, run_id, BufferConfig(max_staleness=2)) as trainer:
        taken = await trainer.take_groups(2, "t", current_version=5)
        assert [g.group_id for g in taken.groups] == ["fresh"]
        assert taken.settled - len(taken.groups) == 1  # the producer frees the reopened group's slot
        assert (taken.reopened, taken.regenerated) == (1, 2)
        stats = await trainer.stats()
        assert (stats.groups_reopened, stats.members_regenerated, stats.regenerate_queued) == (1, 2, 1)
        assert (stats.groups_open, stats.groups_taken, stats.groups_waiting) == (1, 1, 0)
        (request,) = await trainer.pop_regenerate(5)
        assert (request.group_id, request.indices, request.oldest_version, request.current_version) == (
            "g",
            [0, 2],
            1,
            5,
        )
        assert request.metadata == {"prompt": "p-g"}
        assert await trainer.pop_regenerate() == []
        # The regenerated members join the same group at the freed indices; the kept one stays.
        with pytest.raises(ConflictError, match="index 1 of group g is taken"):
            await buf.open_session(SessionInfo("again-1", "g", 1, 3))
        for index in request.indices:
            sid = f"again-{index}"
            await buf.open_session(SessionInfo(sid, "g", index, 3, {"prompt": "p-g"}))
            await buf.append_turn(turn(sid, 0, version=5))
            await buf.finish_session(sid, 10.0 + index, "completed")
        (group,) = (await trainer.take_groups(2, "t", current_version=6)).groups
        assert group.group_id == "g"
        assert [(s.session_id, s.reward, s.weight_versions) for s in group.samples] == [
            ("again-0", 10.0, [5]),
            ("g-1", 1.0, [4]),
            ("again-2", 12.0, [5]),
        ]
        assert await trainer.ack(["g", "fresh"]) == 2
    # The retired sessions stay stored (export shows them) but were never handed out.
    assert len(await buf.session_samples("g-0")) == 1


async def test_a_fully_stale_group_is_regenerated_whole_then_dropped_if_still_stale(buf: Buffer, valkey, run_id):
    await write_group(buf, "old", version=1)
    async with Buffer(valkey.url, run_id, BufferConfig(max_staleness=0, max_regenerations=1)) as trainer:
        first = await trainer.take_groups(1, "t", current_version=2)
        assert first.groups == []
        (request,) = await trainer.pop_regenerate()
        assert (request.group_id, request.indices) == ("old", [0, 1])
        for index in request.indices:  # the episodes outlast the bound again
            sid = f"again-{index}"
            await buf.open_session(SessionInfo(sid, "old", index, 2, {"prompt": "p-old"}))
            await buf.append_turn(turn(sid, 0, version=2))
            await buf.finish_session(sid, 1.0, "completed")
        second = await trainer.take_groups(1, "t", current_version=3)
        assert second.groups == []
        assert await trainer.pop_regenerate() == []  # dropped, not queued again
        assert second.dropped_stale == 1 and first.settled + second.settled == 2
    stats = await buf.stats()
    assert (stats.members_regenerated, stats.groups_reopened, stats.groups_dropped_stale) == (2, 1, 1)
    assert (stats.groups_open, stats.groups_waiting) == (0, 0)


async def test_failed_policy_and_filter_by_import_path(valkey, run_id):
    config = BufferConfig(
        failed_policy="keep_successful",
        min_successful=2,
        group_filter_path="slimeish.buffer.filters.nonzero_reward_variance",
    )
    async with Buffer(valkey.url, run_id, config) as buf:
        await write_group(buf, "same", rewards=[1.0, 1.0])
        await write_group(buf, "varied", size=3, rewards=[0.0, 1.0, 1.0])
        for gid, failures in (("one-failed", 1), ("two-failed", 2)):
            for i in range(3):
                if i < failures:
                    await buf.open_session(SessionInfo(f"{gid}-{i}", gid, i, 3))
                    await buf.fail_session(f"{gid}-{i}", "reward function raised")
                else:
                    await write_session(buf, gid, i, 3, reward=float(i))
        taken = await buf.take_groups(10, "t")
        kept = taken.groups
        assert [(g.group_id, len(g.samples)) for g in kept] == [("varied", 3), ("one-failed", 2)]
        assert [s.index for s in kept[1].samples] == [1, 2]
        stats = await buf.stats()
        assert (stats.groups_filtered, stats.groups_dropped_failed, stats.groups_taken) == (1, 1, 2)
        assert taken.settled - len(kept) == 2  # the same drops, counted in-process for the producer


def test_bad_filter_path_fails_at_construction(valkey, run_id):
    with pytest.raises(ValueError, match="expected def keep"):
        Buffer(valkey.url, run_id, BufferConfig(group_filter_path="slimeish.buffer.filters.no_such_filter"))


async def test_evaluation_groups_are_stored_but_never_handed_out(buf: Buffer):
    for i in range(2):
        await buf.open_session(SessionInfo(f"e-{i}", "eval-1", i, 2, {"prompt": "p"}, trainable=False))
        await buf.finish_session(f"e-{i}", 1.0)
    await write_group(buf, "g1", 2)
    assert [g.group_id for g in (await buf.take_groups(5, "trainer")).groups] == ["g1"]
    stats = await buf.stats()
    assert (stats.groups_evaluated, stats.groups_open, stats.groups_taken) == (1, 0, 1)
    assert [s.reward for s in await buf.session_samples("e-0")] == []  # no turns: no segment samples
    with pytest.raises(ConflictError, match="trainable"):  # one group cannot mix the two kinds
        await buf.open_session(SessionInfo("x", "eval-1", 1, 2, {}, trainable=True))


async def test_recovery_queues_what_a_dead_rollout_side_left_unfinished(buf: Buffer, valkey, run_id):
    # r: reopened for its stale member 0, and the regeneration request was popped by a process that then died.
    for index, version in enumerate((1, 5)):
        await write_session(buf, "r", index, 2, version=version)
    async with Buffer(valkey.url, run_id, BufferConfig(max_staleness=1)) as trainer:
        assert (await trainer.take_groups(1, "t", current_version=5)).groups == []
        assert len(await trainer.pop_regenerate(5)) == 1
    # g: member 0 finished, member 1's agent died mid-episode (its session is open), member 2 never started.
    await write_session(buf, "g", 0, 3, reward=1.0)
    await buf.open_session(SessionInfo("g-1", "g", 1, 3, {"prompt": "p-g"}))
    await buf.append_turn(turn("g-1", 0))
    await write_group(buf, "done", version=5)  # complete: untouched
    await buf.open_session(SessionInfo("eval-0", "eval", 0, 2, trainable=False))  # evaluation: untouched
    await buf.redis.rpush(buf.keys.regenerate, b'{"left": "from before the crash"}')

    requests = await buf.recover_open_groups()
    assert sorted((r.group_id, r.indices) for r in requests) == [("g", [1, 2]), ("r", [0])]
    assert [r.metadata for r in requests if r.group_id == "g"] == [{"prompt": "p-g"}]
    again = await buf.recover_open_groups()  # idempotent: the same places are still free
    assert sorted(again, key=lambda r: r.group_id) == sorted(requests, key=lambda r: r.group_id)
    stats = await buf.stats()
    assert (stats.sessions_open, stats.regenerate_queued) == (1, 2)  # only the evaluation session is open
    assert await buf.redis.hget(buf.keys.session("g-1"), "status") == b"aborted"
    assert sorted((r.group_id, r.indices) for r in await buf.pop_regenerate(10)) == [("g", [1, 2]), ("r", [0])]

    # The freed places are filled: the group completes with its kept member and is trained whole.
    await write_session(buf, "g", 2, 3, reward=2.0)
    await buf.open_session(SessionInfo("g-1-again", "g", 1, 3))
    await buf.append_turn(turn("g-1-again", 0))
    await buf.finish_session("g-1-again", 1.5, "completed")
    taken = {g.group_id: g for g in (await buf.take_groups(5, "t")).groups}
    assert set(taken) == {"done", "g"}
    assert [(s.session_id, s.reward) for s in taken["g"].samples] == [("g-0", 1.0), ("g-1-again", 1.5), ("g-2", 2.0)]


async def test_recovery_regenerates_members_whose_reward_never_came(buf: Buffer):
    # The rollout side finished member 1's episode and died before its reward function ran.
    await write_session(buf, "g", 0, 2, reward=1.0)
    await write_session(buf, "g", 1, 2, reward=None)  # finished, reward left for set_reward
    (request,) = await buf.recover_open_groups()
    assert (request.group_id, request.indices) == ("g", [1])
    assert await buf.redis.hget(buf.keys.session("g-1"), "retired_at") is not None
    with pytest.raises(ConflictError, match="retired"):  # a late reward cannot complete the group
        await buf.set_reward("g-1", 0.5)
    assert (await buf.take_groups(1, "t")).groups == []
    await buf.open_session(SessionInfo("g-1-again", "g", 1, 2))
    await buf.append_turn(turn("g-1-again", 0))
    await buf.finish_session("g-1-again", 0.5, "completed")
    (group,) = (await buf.take_groups(1, "t")).groups
    assert [(s.session_id, s.reward) for s in group.samples] == [("g-0", 1.0), ("g-1-again", 0.5)]


async def test_after_note_resume_the_killed_runs_newer_tokens_are_regenerated(buf: Buffer, valkey, run_id):
    await write_session(buf, "g", 0, 2, version=3)  # the checkpoint's weights: valid
    await write_session(buf, "g", 1, 2, version=5)  # weights trained after the checkpoint: discarded
    async with Buffer(valkey.url, run_id) as trainer:
        await trainer.note_resume(3)
        # version 5 again, but not these weights
        assert (await trainer.take_groups(1, "t", current_version=5)).groups == []
        (request,) = await trainer.pop_regenerate()
        assert request.indices == [1]
        await trainer.open_session(SessionInfo("g-1-new", "g", 1, 2))
        await trainer.append_turn(turn("g-1-new", 0, version=5))  # this run's version 5
        await trainer.finish_session("g-1-new", 1.0, "completed")
        (group,) = (await trainer.take_groups(1, "t", current_version=5)).groups
        assert [s.session_id for s in group.samples] == ["g-0", "g-1-new"]


async def test_a_resume_is_stored_for_every_later_trainer(buf: Buffer, valkey, run_id):
    await write_session(buf, "h", 0, 1, version=5)
    async with Buffer(valkey.url, run_id) as resumed:
        await resumed.note_resume(3)
    async with Buffer(valkey.url, run_id) as restarted:  # another process reads it from the buffer
        assert (await restarted.take_groups(1, "t", current_version=5)).groups == []
        assert (await restarted.stats()).groups_reopened == 1


async def test_a_routers_recovery_closes_only_the_sessions_it_opened(buf: Buffer):
    # Group g: member 0 open on router0 (which died), member 1 open on router1 (alive), member 2
    # finished by router0 and waiting for its reward from the rollout side (alive).
    await buf.open_session(SessionInfo("g-0", "g", 0, 3, {"prompt": "p"}, owner="router0"))
    await buf.append_turn(turn("g-0", 0))
    await buf.open_session(SessionInfo("g-1", "g", 1, 3, owner="router1"))
    await buf.open_session(SessionInfo("g-2", "g", 2, 3, owner="router0"))
    await buf.append_turn(turn("g-2", 0))
    await buf.finish_session("g-2", None, "completed")
    await buf.redis.rpush(buf.keys.regenerate, b'{"group_id": "queued by someone alive"}')

    (request,) = await buf.recover_open_groups(owner="router0")
    assert (request.group_id, request.indices, request.metadata) == ("g", [0], {"prompt": "p"})
    assert await buf.recover_open_groups(owner="router0") == []  # nothing of router0's is open any more
    statuses = [await buf.redis.hget(buf.keys.session(f"g-{i}"), "status") for i in range(3)]
    assert statuses == [b"aborted", b"pending", b"completed"]
    assert await buf.redis.llen(buf.keys.regenerate) == 2  # the queue is added to, not rebuilt
    assert await buf.set_reward("g-2", 1.0)  # the rollout side's reward still lands
    await buf.append_turn(turn("g-1", 0))  # router1's session goes on
    await buf.finish_session("g-1", 0.5, "completed")
