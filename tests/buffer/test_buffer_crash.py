"""Crash behaviour with real processes: a SIGKILLed consumer, a SIGKILLed server, concurrent writers."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import redis

from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.buffer.keys import Keys
from slimeish.common.procs import ManagedProcess
from tests.buffer.buffer_helpers import write_group

PROCS = str(Path(__file__).with_name("buffer_procs.py"))
REPO = str(Path(__file__).resolve().parents[2])


def child(*args: str) -> ManagedProcess:
    # PYTHONPATH: the child runs a script from tests/, so the repository root must be importable
    return ManagedProcess([sys.executable, PROCS, *args], env={"PYTHONPATH": REPO})


def wait_for(predicate, timeout: float = 30.0, proc: ManagedProcess | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc is None or proc.proc.poll() is None, f"child exited with {proc.proc.returncode}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


async def test_sigkilled_consumer_gets_its_unacknowledged_groups_back(buf: Buffer, valkey, run_id, tmp_path):
    for g in range(4):
        await write_group(buf, f"g{g}")
    out = tmp_path / "taken.json"
    with child("consume", valkey.url, run_id, "3", str(out)) as consumer:
        wait_for(out.exists, proc=consumer)
        consumer.kill()  # SIGKILL between take and acknowledge
    taken = json.loads(out.read_text())
    assert taken == {"acked": "g0", "held": ["g1", "g2"]}
    async with Buffer(valkey.url, run_id) as restarted:
        again = (await restarted.take_groups(2, "trainer-0")).groups
        assert [g.group_id for g in again] == taken["held"]  # the same groups, whole
        assert [len(g.samples) for g in again] == [2, 2]
        assert [g.group_id for g in (await restarted.take_groups(5, "trainer-0")).groups] == ["g3"]  # never g0
        assert await restarted.ack(["g1", "g2", "g3"]) == 3
        assert (await restarted.stats()).groups_trained == 4


def group_invariants(client: redis.Redis, keys: Keys, gid: str) -> tuple[int, bytes]:
    """Check a group is never half-sealed: its counters agree with its members. Returns (done, state)."""
    group = client.hgetall(keys.group(gid))
    members = client.hgetall(keys.members(gid)).values()
    rewarded = [m for m in members if client.hget(keys.session(m.decode()), "reward") not in (b"", None)]
    assert int(group[b"done"]) == len(rewarded)
    for m in rewarded:
        assert client.hlen(keys.samples(m.decode())) == 1  # finished with its sample, or not at all
    complete = int(group[b"done"]) == int(group[b"size"])
    assert (group[b"state"] != b"open") == complete
    return int(group[b"done"]), group[b"state"]


async def test_sigkilled_server_keeps_every_acknowledged_write(tmp_path):
    data, log = tmp_path / "run", tmp_path / "acked.txt"
    server = EmbeddedServer(data).start()
    try:
        async with Buffer(server.url, "r") as buf:
            await write_group(buf, "pre0")
            await write_group(buf, "pre1")
            taken = (await buf.take_groups(2, "trainer-0")).groups
            await buf.ack([taken[0].group_id])
        with child("write", server.url, "r", "w", "400", "2", "0,1", str(log)) as writer:
            wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 60, proc=writer)
            server.kill()  # SIGKILL while the writer is busy
            acked = log.read_text().split()
        assert 60 <= len(acked) < 800  # killed mid-way through the writer's 800 sessions
        server = EmbeddedServer(data, server.port).start()  # restart on the same directory
        keys, client = Keys("r"), redis.Redis.from_url(server.url)
        groups = {sid.rsplit("-", 1)[0] for sid in acked}
        states = [group_invariants(client, keys, gid) for gid in groups]
        assert any(state == b"ready" for _, state in states)
        client.close()
        async with Buffer(server.url, "r") as buf:
            for sid in acked:
                (sample,) = await buf.session_samples(sid)
                index = int(sid.rsplit("-", 1)[1])
                assert sample.tokens == [1, 2, 3, index, 4, 5, 6, 7, 8, 9] and sample.reward == float(index)
                assert sample.loss_mask == [1, 1, 1, 0, 0, 1] and sample.status.value == "completed"
            again = (await buf.take_groups(1, "trainer-0")).groups
            assert [g.group_id for g in again] == ["pre1"]  # taken, not acknowledged before the crash
            assert (await buf.stats()).groups_trained == 1
    finally:
        server.stop()


async def test_concurrent_writers_on_one_group_make_one_complete_group(buf: Buffer, valkey, run_id, tmp_path):
    log = tmp_path / "acked.txt"
    writers = [child("write", valkey.url, run_id, "shared", "1", "8", f"{i},{i + 4}", str(log)) for i in range(4)]
    try:
        for w in writers:
            wait_for(lambda w=w: w.proc.poll() is not None)
            assert w.proc.returncode == 0
    finally:
        for w in writers:
            w.stop()
    assert sorted(log.read_text().split()) == sorted(f"shared0-{i}" for i in range(8))
    (group,) = (await buf.take_groups(5, "t")).groups
    assert group.group_id == "shared0" and [s.index for s in group.samples] == list(range(8))
    assert [s.reward for s in group.samples] == [float(i) for i in range(8)]
    stats = await buf.stats()
    assert (stats.sessions_finished, stats.groups_taken, stats.groups_waiting, stats.groups_open) == (8, 1, 0, 0)


async def test_torn_aof_tail_loses_the_last_script_whole(tmp_path):
    """A write cut off mid-way (e.g. power loss) replays none of its script, never half of it."""
    with EmbeddedServer(tmp_path) as server:
        async with Buffer(server.url, "r") as buf:
            await write_group(buf, "g", 2)
    aof = next((tmp_path / "appendonly").glob("*.incr.aof"))
    data = aof.read_bytes()
    aof.write_bytes(data[: data.rindex(b"EXEC") - 40])  # cut inside the last MULTI/EXEC: the seal of g-1
    with EmbeddedServer(tmp_path) as server:
        keys, client = Keys("r"), redis.Redis.from_url(server.url)
        assert client.hget(keys.session("g-0"), "status") == b"completed"
        assert client.hget(keys.session("g-1"), "status") == b"pending"  # its finish is gone entirely
        assert not client.exists(keys.samples("g-1"))
        assert group_invariants(client, keys, "g") == (1, b"open")
        client.close()
