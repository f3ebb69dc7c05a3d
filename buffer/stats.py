"""`BufferStats`: what `slimeish buffer stats` prints, read in one pipelined round trip."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from redis.asyncio import Redis

from slimeish.buffer.keys import CONSUMER_GROUP, Keys


@dataclass(slots=True)
class BufferStats:
    sessions_open: int
    sessions_finished: int  # finished with any status but failed
    sessions_failed: int
    groups_open: int  # some member not finished (or not rewarded) yet
    groups_waiting: int  # complete, not yet handed to a trainer
    groups_taken: int  # handed to a trainer, not yet acknowledged
    groups_trained: int  # acknowledged
    groups_dropped_failed: int
    groups_reopened: int  # times a complete group had stale members, which are generated again
    members_regenerated: int  # stale members retired from reopened groups (never trained on)
    groups_dropped_stale: int  # still stale after max_regenerations reopenings
    groups_filtered: int
    groups_given_back: int  # times a taken group was returned to the queue
    groups_evaluated: int  # complete evaluation groups (stored, never trained)
    regenerate_queued: int  # requests waiting: stale members of reopened groups, places crash recovery freed
    bytes_turns: int  # turns as stored: the token data (ids, log-probs)
    bytes_samples: int  # sample headers written at finish
    used_memory: int  # the whole server's, from INFO memory

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


async def read_stats(redis: Redis, keys: Keys) -> BufferStats:
    pipe = redis.pipeline(transaction=False)
    pipe.hgetall(keys.stats)
    pipe.xlen(keys.ready)
    pipe.xpending(keys.ready, CONSUMER_GROUP)
    pipe.llen(keys.regenerate)
    pipe.info("memory")
    counters, queued, pending, regenerate, memory = await pipe.execute()
    c = {k.decode(): int(v) for k, v in counters.items()}
    taken = pending["pending"]
    return BufferStats(
        sessions_open=c.get("sessions_open", 0),
        sessions_finished=c.get("sessions_finished", 0),
        sessions_failed=c.get("sessions_failed", 0),
        groups_open=c.get("groups_open", 0),
        groups_waiting=queued - taken,
        groups_taken=taken,
        groups_trained=c.get("groups_trained", 0),
        groups_dropped_failed=c.get("groups_dropped_failed", 0),
        groups_reopened=c.get("groups_reopened", 0),
        members_regenerated=c.get("members_regenerated", 0),
        groups_dropped_stale=c.get("groups_dropped_stale", 0),
        groups_filtered=c.get("groups_filtered", 0),
        groups_given_back=c.get("groups_given_back", 0),
        groups_evaluated=c.get("groups_evaluated", 0),
        regenerate_queued=regenerate,
        bytes_turns=c.get("bytes_turns", 0),
        bytes_samples=c.get("bytes_samples", 0),
        used_memory=int(memory["used_memory"]),
    )
