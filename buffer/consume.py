"""The trainer's side of `Buffer`: taking whole trainable groups from the ready stream through a
consumer group (exactly once: an entry handed out and not acknowledged is handed out again after a
crash), judging each against the group rules, and acknowledging or giving back what was taken.
`Buffer` holds one `GroupConsumer` and passes these calls to it; its state (the consumer group,
per-consumer cursors, the run's resumes) is used only here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, cast

import orjson
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from slimeish.buffer.batching import ScriptBatcher
from slimeish.buffer.codec import decode_member
from slimeish.buffer.config import BufferConfig
from slimeish.buffer.errors import BufferInputError
from slimeish.buffer.group_scripts import (
    ACK,
    DROP,
    GIVE_BACK,
    REOPEN,
    DropArgs,
    DropKeys,
    ReopenArgs,
    ReopenKeys,
    TakenArgs,
    TakenKeys,
)
from slimeish.buffer.keys import CONSUMER_GROUP, Keys
from slimeish.buffer.records import Group, RegenerateRequest, TakeResult
from slimeish.buffer.replies import (
    Fields,
    StreamEntry,
    claimed_entries,
    hash_fields,
    read_entries,
    required,
    sessions_by_index,
)
from slimeish.buffer.rules import GroupFilter, Member, Resume, judge, oldest_version
from slimeish.buffer.scripts import LuaScript
from slimeish.common.sample import Status

# The fields each read takes from a session or group hash (keys.py lists them all).
_MEMBER_READ = ("status", "reward", "created_at")
_GROUP_READ = ("metadata", "reopened")


@dataclass(slots=True)
class _Candidate:
    """A complete group read back from a ready-stream entry, before it is judged."""

    entry_id: str
    group_id: str
    metadata: dict[str, Any]
    reopened: int  # times the group was reopened for stale members
    sessions: list[tuple[int, str]]  # (index in group, session id), by index


class GroupConsumer:
    """Take, acknowledge and give back groups, and note resumes, over the `Buffer`'s connection."""

    def __init__(
        self, redis: Redis, keys: Keys, config: BufferConfig, scripts: ScriptBatcher, group_filter: GroupFilter | None
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.config = config
        self._scripts = scripts
        self._filter = group_filter
        self._pending_cursor: dict[str, str] = {}  # consumer -> last pending entry re-read after a restart
        self._recovered: set[str] = set()  # consumers whose earlier (crashed) deliveries were re-read
        self._consumer_group_made = False
        self._resumes: list[Resume] = []  # the run's resumes, read once per object (see note_resume)

    async def prepare(self) -> None:
        """Once per object, before the first take, ack or stats: the run's resumes, the consumer group."""
        if self._consumer_group_made:
            return
        self._resumes = [Resume(**orjson.loads(r)) for r in await self.redis.lrange(self.keys.resumes, 0, -1)]
        try:  # from id 0, so groups completed before the first trainer started are seen too
            await self.redis.xgroup_create(self.keys.ready, CONSUMER_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._consumer_group_made = True

    async def take_groups(self, n: int, consumer: str, current_version: int | None = None) -> TakeResult:
        """Hand out up to `n` trainable groups to `consumer` (non-blocking; fewer if fewer are ready).

        The first calls of a process under a consumer name first return that consumer's groups
        handed out before and never acknowledged (the trainer crashed), then new ones. Groups
        that break the failed-member policy, the staleness bound (against `current_version`)
        or the filter hook are never returned; a group with stale members is reopened and the
        regeneration of those members queued (`pop_regenerate`). The result counts those skips
        too: a producer that bounds the groups in flight frees their slots (`settled`).
        """
        if n < 1:
            raise BufferInputError(f"take_groups needs n >= 1, got {n}")
        await self.prepare()
        result = TakeResult()
        while len(result.groups) < n:
            entries = await self._next_entries(n - len(result.groups), consumer)
            if not entries:
                break
            await self._judge_entries(entries, current_version, result)
        return result

    async def _next_entries(self, count: int, consumer: str) -> list[StreamEntry]:
        if consumer not in self._recovered:  # re-read our own unacknowledged deliveries first
            cursor = self._pending_cursor.get(consumer, "0")
            entries = read_entries(
                await self.redis.xreadgroup(CONSUMER_GROUP, consumer, {self.keys.ready: cursor}, count=count)
            )
            if len(entries) < count:
                self._recovered.add(consumer)
            if entries:
                self._pending_cursor[consumer] = entries[-1].entry_id
                return entries
        if self.config.reclaim_after_s is not None:
            idle_ms = int(self.config.reclaim_after_s * 1000)
            claimed = claimed_entries(
                await self.redis.xautoclaim(self.keys.ready, CONSUMER_GROUP, consumer, idle_ms, count=count)
            )
            if claimed:
                return claimed
        return read_entries(await self.redis.xreadgroup(CONSUMER_GROUP, consumer, {self.keys.ready: ">"}, count=count))

    async def _judge_entries(self, entries: list[StreamEntry], current_version: int | None, result: TakeResult) -> None:
        """Hand out the entries' trainable groups and settle the others, both into `result`."""
        candidates = await self._load_candidates([e for e in entries if e.group_id is not None])
        skips: list[Awaitable[int]] = []  # concurrent script calls: the batcher sends them in one round trip
        kinds: list[tuple[str, int]] = []  # (verdict state, members regenerated) of each skip
        for group, members in zip(candidates, await self._load_members(candidates), strict=True):
            gid, entry = group.group_id, group.entry_id
            verdict = judge(gid, members, self.config, current_version, self._filter, group.reopened, self._resumes)
            if verdict.keep:
                result.groups.append(Group(gid, verdict.samples, group.metadata, entry))
            elif verdict.state == "reopen":
                skips.append(self._reopen(gid, entry, group.metadata, verdict.stale, current_version))
                kinds.append((verdict.state, len(verdict.stale)))
            else:
                skips.append(self._drop(gid, entry, verdict.state))
                kinds.append((verdict.state, 0))
        orphans = [e.entry_id for e in entries if e.group_id is None]  # deleted after delivery: nothing to train
        if orphans:
            await self.redis.xack(self.keys.ready, CONSUMER_GROUP, *orphans)
        # DROP and REOPEN answer 1 when they settled the group, 0 when another consumer already did.
        for (state, regenerated), settled in zip(kinds, await asyncio.gather(*skips), strict=True):
            if settled:
                result.count_skip(state, regenerated)

    async def _load_candidates(self, entries: list[StreamEntry]) -> list[_Candidate]:
        pipe = self.redis.pipeline(transaction=False)
        for entry in entries:
            gid = cast(str, entry.group_id)  # the caller passes only entries that still name a group
            pipe.hmget(self.keys.group(gid), _GROUP_READ)
            pipe.hgetall(self.keys.members(gid))
        replies = iter(await pipe.execute())
        candidates = []
        for entry in entries:
            group, members = hash_fields(_GROUP_READ, next(replies)), next(replies)
            candidates.append(
                _Candidate(
                    entry_id=entry.entry_id,
                    group_id=cast(str, entry.group_id),
                    metadata=orjson.loads(required(group, "metadata")),
                    reopened=int(group["reopened"] or 0),
                    sessions=sessions_by_index(members),
                )
            )
        return candidates

    async def _load_members(self, candidates: list[_Candidate]) -> list[list[Member]]:
        """Every candidate's members with their samples, read in one pipelined round trip."""
        k = self.keys
        pipe = self.redis.pipeline(transaction=False)
        for group in candidates:
            for _, sid in group.sessions:
                pipe.hgetall(k.samples(sid))
                pipe.hgetall(k.turns(sid))
                pipe.hmget(k.session(sid), _MEMBER_READ)
        replies = iter(await pipe.execute())
        return [
            [
                _member(index, sid, next(replies), next(replies), hash_fields(_MEMBER_READ, next(replies)))
                for index, sid in group.sessions
            ]
            for group in candidates
        ]

    async def _drop(self, gid: str, entry: str, state: str) -> int:
        keys = DropKeys(group=self.keys.group(gid), ready=self.keys.ready, stats=self.keys.stats)
        args = DropArgs(
            entry_id=entry, consumer_group=CONSUMER_GROUP, state=state, counter=f"groups_{state}", now=time.time()
        )
        return int(await self._scripts.run(DROP, keys, args))

    async def _reopen(
        self, gid: str, entry: str, metadata: dict[str, Any], stale: list[Member], current: int | None
    ) -> int:
        oldest = oldest_version([s for m in stale for s in m.samples])
        request = RegenerateRequest(gid, metadata, [m.index for m in stale], oldest, current)
        k = self.keys
        keys = ReopenKeys(
            group=k.group(gid),
            members=k.members(gid),
            ready=k.ready,
            stats=k.stats,
            regenerate=k.regenerate,
            sessions=tuple(k.session(m.session_id) for m in stale),
        )
        args = ReopenArgs(
            entry_id=entry,
            consumer_group=CONSUMER_GROUP,
            regenerate_json=orjson.dumps(asdict(request)),
            now=time.time(),
            indices=tuple(m.index for m in stale),
        )
        return int(await self._scripts.run(REOPEN, keys, args))

    async def ack(self, group_ids: Iterable[str]) -> int:
        """Acknowledge trained groups (after the step is committed): never handed out again.

        All or nothing: if one id is unknown or not handed out, none is acknowledged. Returns how
        many were newly acknowledged; acknowledging a group twice is a no-op."""
        return await self._per_batch(ACK, list(group_ids))

    async def give_back(self, group_ids: Iterable[str]) -> int:
        """Return taken, unacknowledged groups to the queue so any consumer can take them again (all or nothing)."""
        return await self._per_batch(GIVE_BACK, list(group_ids))

    async def _per_batch(self, script: LuaScript[TakenKeys, TakenArgs], group_ids: list[str]) -> int:
        if not group_ids:
            return 0
        await self.prepare()
        groups = tuple(self.keys.group(gid) for gid in group_ids)
        keys = TakenKeys(ready=self.keys.ready, stats=self.keys.stats, groups=groups)
        args = TakenArgs(consumer_group=CONSUMER_GROUP, now=time.time(), group_ids=tuple(group_ids))
        return int(await self._scripts.run(script, keys, args))

    async def note_resume(self, version: int) -> None:
        """A trainer resumes from a checkpoint of weight `version`: from now on, tokens of newer
        versions in sessions opened before now are stale (the killed run sampled them with weights
        this run discarded, and this run will reuse those version numbers)."""
        await self.prepare()  # reads the earlier resumes first, so this one is not read twice
        resume = Resume(time.time(), version)
        await self.redis.rpush(self.keys.resumes, orjson.dumps(asdict(resume)))
        self._resumes.append(resume)


def _member(
    index: int, session_id: str, headers: dict[bytes, bytes], turns: dict[bytes, bytes], session: Fields
) -> Member:
    samples = decode_member(headers, turns, session["reward"])
    status = Status(required(session, "status").decode())
    return Member(index, session_id, status, samples, float(session["created_at"] or 0))
