"""`Buffer`: the async client the router (writes), rollout side and trainer (reads) share.

One `Buffer` per process, created from a Redis URL and a run id. Writes that must go together
run as one Lua script (atomic in Redis), and concurrent calls share pipelines; token arrays
travel as packed bytes once, with their turn (finishing a session sends only sample headers),
never per token. Trainable groups are entries of a Redis stream
read through a consumer group, which gives exactly-once training: an entry handed out and not
acknowledged stays pending and is handed out again (see `take_groups`); an acknowledged one is
deleted.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

import orjson
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.driver_info import DriverInfo
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from slimeish.buffer import scripts
from slimeish.buffer.batching import ScriptBatcher
from slimeish.buffer.codec import decode_sample_header, decode_turn, encode_sample_header, encode_turn
from slimeish.buffer.config import FILTER_SIGNATURE, BufferConfig
from slimeish.buffer.errors import BufferInputError, UnknownSessionError, from_script_error
from slimeish.buffer.keys import CONSUMER_GROUP, Keys, run_id_from_stats_key, run_ids_pattern
from slimeish.buffer.records import Group, PackedTurn, RegenerateRequest, SessionInfo, TakeResult, Turn
from slimeish.buffer.replies import (
    Fields,
    StreamEntry,
    as_bytes,
    claimed_entries,
    hash_fields,
    hash_values,
    read_entries,
    required,
)
from slimeish.buffer.rules import GroupFilter, Member, Resume, judge, oldest_version
from slimeish.buffer.segments import PackedSample, assemble, build_samples, check_next_turn, split_teacher_log_probs
from slimeish.buffer.stats import BufferStats, read_stats
from slimeish.buffer.views import GroupView, SessionView, group_view, session_view
from slimeish.common.plugins import load_function
from slimeish.common.sample import Sample, Status

# The fields each read takes from a session or group hash (keys.py lists them all).
_FINISH_READ = ("status", "n_turns", "index", "group_seq", "metadata", "group_id")
_MEMBER_READ = ("status", "reward", "created_at")
_GROUP_READ = ("metadata", "reopened")
_RECOVER_READ = ("state", "trainable", "metadata")
_SCRIPTS = (
    "OPEN_SESSION",
    "APPEND_TURN",
    "FINISH_SESSION",
    "SET_REWARD",
    "RECOVER_OWNED",
    "ACK",
    "GIVE_BACK",
    "DROP",
    "REOPEN",
    "RECOVER",
    "ABORT_SESSION",
)


def _json(value: Any, what: str) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        raise BufferInputError(f"{what} must be JSON-serialisable: {exc}") from None


def _reward_json(reward: float | None) -> bytes:
    """The stored reward: b"" while it is still to come, else a finite number."""
    if reward is None:
        return b""
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise BufferInputError(f"reward must be a finite number, got {reward!r}")
    return orjson.dumps(reward)


def _final_status(status: Status | str) -> Status:
    """How a finished session ended: any status but PENDING (which means still open)."""
    try:
        final = Status(status)
    except ValueError:
        final = Status.PENDING
    if final is Status.PENDING:
        raise BufferInputError(f"finish_session needs a final status, got {status!r}")
    return final


@dataclass(slots=True)
class _Candidate:
    """A complete group read back from a ready-stream entry, before it is judged."""

    entry_id: str
    group_id: str
    metadata: dict[str, Any]
    reopened: int  # times the group was reopened for stale members
    sessions: list[tuple[int, str]]  # (index in group, session id), by index


# A command that loses its connection is sent again on a new one, with backoff (0.1 s doubling to
# 2 s): about a minute, long enough for a supervised buffer server to be restarted.
RECONNECT_TRIES = 35


class Buffer:
    """The data buffer of one run in one Redis database."""

    def __init__(
        self, url: str, run_id: str, config: BufferConfig | None = None, group_filter: GroupFilter | None = None
    ) -> None:
        """`group_filter`: a filter given as a function rather than by `group_filter_path`."""
        self.keys = Keys(run_id)
        self.config = config or BufferConfig()
        # hiredis parses replies when installed; one DriverInfo, or redis-py reads its package
        # metadata again for every new pooled connection
        self.redis = Redis.from_url(
            url, driver_info=DriverInfo(), retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), RECONNECT_TRIES),
            retry_on_error=[ConnectionError, TimeoutError],
        )  # fmt: skip
        self._scripts = {name: self.redis.register_script(getattr(scripts, name)) for name in _SCRIPTS}
        self._batcher = ScriptBatcher(self.redis)
        self._filter: GroupFilter | None = group_filter
        if self.config.group_filter_path and group_filter is not None:
            raise ValueError("give a group filter by group_filter_path or as a function, not both")
        if self.config.group_filter_path:
            self._filter = load_function(
                self.config.group_filter_path,
                expected=FILTER_SIGNATURE,
                params=["group_id", "samples"],
                is_async=False,
            )
        self._turns: dict[str, list[PackedTurn]] = {}  # turns this process appended to still-open sessions
        self._pending_cursor: dict[str, str] = {}  # consumer -> last pending entry re-read after a restart
        self._recovered: set[str] = set()  # consumers whose earlier (crashed) deliveries were re-read
        self._consumer_group_made = False
        self._resumes: list[Resume] = []  # the run's resumes, read once per object (see note_resume)

    async def aclose(self) -> None:
        await self.redis.aclose()

    async def __aenter__(self) -> Buffer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self._batcher.call(self._scripts[name], keys, args)
        except ResponseError as exc:
            raise from_script_error(str(exc)) or exc from None

    # ---- writes: router and rollout side ---------------------------------------------------------

    async def open_session(self, info: SessionInfo) -> bool:
        """Register a session in its group (created on first use). False if it was already open (retry)."""
        info.validate()
        k, sid, gid = self.keys, info.session_id, info.group_id
        args = [
            sid,
            gid,
            info.index,
            info.group_size,
            _json(info.metadata, "metadata"),
            time.time(),
            int(info.trainable),
            info.owner,
        ]
        return bool(await self._run("OPEN_SESSION", [k.session(sid), k.group(gid), k.members(gid), k.stats], args))

    async def append_turn(self, turn: Turn) -> bool:
        """Store one turn. Turns arrive in order; a retried identical turn is stored once (returns False)."""
        packed = turn.pack()
        cached = self._turns.get(turn.session_id, [])
        if len(cached) < turn.turn_index:  # appended by another process (or before a restart): read them
            cached = self._turns[turn.session_id] = await self._load_turns(turn.session_id)
        earlier = cached[: turn.turn_index]
        previous = earlier[-1] if earlier and len(earlier) == turn.turn_index else None
        check_next_turn(previous, packed, 1 + max((t.segment_index for t in earlier), default=-1))
        k = self.keys
        stored = await self._run(
            "APPEND_TURN",
            [k.session(turn.session_id), k.turns(turn.session_id), k.stats],
            [turn.session_id, turn.turn_index, encode_turn(packed)],
        )
        if stored and len(cached) == turn.turn_index:
            self._turns.setdefault(turn.session_id, cached).append(packed)
        return bool(stored)

    async def finish_session(
        self,
        session_id: str,
        reward: float | None = None,
        status: Status | str = Status.COMPLETED,
        metadata: dict[str, Any] | None = None,
    ) -> bool:
        """Seal a session: build and store one Sample per segment, atomically with the group update.

        `reward=None` (and a status other than failed) leaves the reward for `set_reward`; the
        group becomes trainable once every member is failed or rewarded. A failed session has no
        samples. Returns False if this exact finish was already stored (a retry): nothing changes.
        Read the samples with `session_samples` (returning them here would cost every caller
        the conversion of the arrays to lists).
        """
        status = _final_status(status)
        session_meta, _ = split_teacher_log_probs(metadata or {})  # OPD teacher log-probs: on the samples only
        reward_json, meta_json = _reward_json(reward), _json(session_meta, "metadata")
        k = self.keys
        session = hash_fields(_FINISH_READ, await self.redis.hmget(k.session(session_id), _FINISH_READ))
        if session["status"] is None:
            raise UnknownSessionError(f"unknown session {session_id}")
        n_turns, gid = int(required(session, "n_turns")), required(session, "group_id").decode()
        samples: list[PackedSample] = []
        if session["status"] == Status.PENDING.encode():  # still open: seal it (a retry finds it sealed)
            turns = self._turns.get(session_id, [])
            if len(turns) != n_turns:  # appended by another process: read them back
                turns = await self._load_turns(session_id)
            sample_meta = {**orjson.loads(required(session, "metadata")), **(metadata or {}), "group_id": gid}
            samples = build_samples(
                turns,
                status=status.value,
                index=int(required(session, "index")),
                group_index=int(required(session, "group_seq")),
                metadata=sample_meta,
            )
        pairs = [part for s in samples for part in (s.segment_index, encode_sample_header(s))]
        args = [session_id, n_turns, status.value, reward_json, meta_json, time.time(), *pairs]
        sealed = await self._run(
            "FINISH_SESSION", [k.session(session_id), k.samples(session_id), k.group(gid), k.stats, k.ready], args
        )
        self._turns.pop(session_id, None)
        return bool(sealed)

    async def fail_session(self, session_id: str, error: str = "") -> None:
        """Mark a session failed (never trained on); its group still completes."""
        await self.finish_session(session_id, None, Status.FAILED, {"error": error} if error else None)

    async def set_reward(self, session_id: str, reward: float) -> bool:
        """Attach the reward to a session finished without one. False if this exact reward was already set."""
        reward_json = _reward_json(reward)
        if not reward_json:
            raise BufferInputError("set_reward needs a reward, got None")
        gid = as_bytes(await self.redis.hget(self.keys.session(session_id), "group_id"))
        if gid is None:
            raise UnknownSessionError(f"unknown session {session_id}")
        k = self.keys
        keys = [k.session(session_id), k.samples(session_id), k.group(gid.decode()), k.stats, k.ready]
        return bool(await self._run("SET_REWARD", keys, [session_id, reward_json, time.time()]))

    async def abort_session(self, session_id: str) -> bool:
        """Give an open session's place back: the episode was lost to its infrastructure (a worker
        or node died), not failed by its agent. The session is closed as aborted and retired (its
        turns stay stored, never trained on) and its index in the group is free, for a new session
        to generate the member again. False, changing nothing, if the session is no longer open or
        no longer holds its place (aborted before, finished, or freed by `recover_open_groups`)."""
        gid = as_bytes(await self.redis.hget(self.keys.session(session_id), "group_id"))
        if gid is None:
            raise UnknownSessionError(f"unknown session {session_id}")
        k = self.keys
        keys = [k.session(session_id), k.members(gid.decode()), k.stats]
        aborted = bool(await self._run("ABORT_SESSION", keys, [session_id, time.time()]))
        if aborted:
            self._turns.pop(session_id, None)
        return aborted

    # ---- reads --------------------------------------------------------------------------------

    async def _load_turn(self, session_id: str, turn_index: int) -> PackedTurn | None:
        data = as_bytes(await self.redis.hget(self.keys.turns(session_id), str(turn_index)))
        return decode_turn(data) if data is not None else None

    async def _load_turns(self, session_id: str) -> list[PackedTurn]:
        return _decode_turns(await self.redis.hgetall(self.keys.turns(session_id)))

    async def turns(self, session_id: str) -> list[Turn]:
        """All stored turns of a session, in order."""
        return [t.to_turn() for t in await self._load_turns(session_id)]

    async def session_samples(self, session_id: str) -> list[Sample]:
        """The samples stored when the session was finished (reward included once it is set)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.samples(session_id))
        pipe.hgetall(self.keys.turns(session_id))
        pipe.hget(self.keys.session(session_id), "reward")
        headers, turns, reward = await pipe.execute()
        return _decode_member(headers, turns, reward)

    async def iter_samples(self) -> AsyncIterator[Sample]:
        """Every stored sample of the run (for export and inspection), session by session."""
        async for key in self.redis.scan_iter(match=self.keys.samples_pattern(), count=500):
            for sample in await self.session_samples(self.keys.session_id_from_samples_key(key.decode())):
                yield sample

    async def stats(self) -> BufferStats:
        """Counts of sessions and groups by state, staleness drops, bytes stored."""
        await self._prepare()
        return await read_stats(self.redis, self.keys)

    # ---- inspection (read-only: never writes, not even the consumer group) ---------------------

    async def counters(self) -> dict[str, int]:
        """The run's stored counters (the `BufferStats` fields kept as counts), as they are."""
        raw: Mapping[Any, Any] = await self.redis.hgetall(self.keys.stats)
        return {k.decode(): int(v) for k, v in raw.items()}

    async def groups(self, group_ids: Sequence[str]) -> list[GroupView]:
        """Each group's state, size and members, in one round trip; an unknown id reads as state ""."""
        pipe = self.redis.pipeline(transaction=False)
        for gid in group_ids:
            pipe.hgetall(self.keys.group(gid))
            pipe.hgetall(self.keys.members(gid))
        replies = iter(await pipe.execute())
        return [group_view(gid, next(replies), next(replies)) for gid in group_ids]

    async def sessions(self, session_ids: Sequence[str]) -> dict[str, SessionView]:
        """Each known session's state with its samples' headers, in one round trip (unknown ids left out)."""
        pipe = self.redis.pipeline(transaction=False)
        for sid in session_ids:
            pipe.hgetall(self.keys.session(sid))
            pipe.hgetall(self.keys.samples(sid))
        replies = iter(await pipe.execute())
        views = {sid: (next(replies), next(replies)) for sid in session_ids}
        return {sid: session_view(sid, fields, headers) for sid, (fields, headers) in views.items() if fields}

    async def session(self, session_id: str) -> SessionView | None:
        return (await self.sessions([session_id])).get(session_id)

    async def open_sessions(self, limit: int = 500) -> list[SessionView]:
        """Sessions still open (status pending), oldest first: the episodes in flight."""
        ids = [k.decode().removeprefix(self.keys.session("")) async for k in self.redis.scan_iter(
            match=self.keys.session("*"), count=1000)]  # fmt: skip
        pipe = self.redis.pipeline(transaction=False)
        for sid in ids:
            pipe.hget(self.keys.session(sid), "status")
        statuses = await pipe.execute()
        pending = [sid for sid, status in zip(ids, statuses, strict=True) if status == Status.PENDING.encode()]
        views = await self.sessions(pending)
        return sorted(views.values(), key=lambda v: v.created_at)[:limit]

    # ---- consumption: trainer -----------------------------------------------------------------

    async def _prepare(self) -> None:
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
        await self._prepare()
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
                    sessions=_sessions_by_index(members),
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
        k = self.keys
        keys = [k.group(gid), k.ready, k.stats]
        return await self._run("DROP", keys, [entry, CONSUMER_GROUP, state, f"groups_{state}", time.time()])

    async def _reopen(self, gid: str, entry: str, metadata: dict, stale: list[Member], current: int | None) -> int:
        oldest = oldest_version([s for m in stale for s in m.samples])
        request = RegenerateRequest(gid, metadata, [m.index for m in stale], oldest, current)
        k = self.keys
        keys = [k.group(gid), k.members(gid), k.ready, k.stats, k.regenerate, *(k.session(m.session_id) for m in stale)]
        args = [entry, CONSUMER_GROUP, orjson.dumps(asdict(request)), time.time(), *(m.index for m in stale)]
        return await self._run("REOPEN", keys, args)

    async def ack(self, group_ids: Iterable[str]) -> int:
        """Acknowledge trained groups (after the step is committed): never handed out again.

        All or nothing: if one id is unknown or not handed out, none is acknowledged. Returns how
        many were newly acknowledged; acknowledging a group twice is a no-op."""
        return await self._per_batch("ACK", list(group_ids))

    async def give_back(self, group_ids: Iterable[str]) -> int:
        """Return taken, unacknowledged groups to the queue so any consumer can take them again (all or nothing)."""
        return await self._per_batch("GIVE_BACK", list(group_ids))

    async def _per_batch(self, name: str, group_ids: list[str]) -> int:
        if not group_ids:
            return 0
        await self._prepare()
        keys = [self.keys.ready, self.keys.stats, *(self.keys.group(gid) for gid in group_ids)]
        return await self._run(name, keys, [CONSUMER_GROUP, time.time(), *group_ids])

    async def note_resume(self, version: int) -> None:
        """A trainer resumes from a checkpoint of weight `version`: from now on, tokens of newer
        versions in sessions opened before now are stale (the killed run sampled them with weights
        this run discarded, and this run will reuse those version numbers)."""
        await self._prepare()  # reads the earlier resumes first, so this one is not read twice
        resume = Resume(time.time(), version)
        await self.redis.rpush(self.keys.resumes, orjson.dumps(asdict(resume)))
        self._resumes.append(resume)

    async def recover_open_groups(self, owner: str | None = None) -> list[RegenerateRequest]:
        """Queue again whatever the rollout side was generating when it died; call it on resume,
        before any rollout runs.

        Every open training group gets one request for its places that can no longer be filled:
        indices no session holds (a regeneration popped by the dead process) and sessions still
        open (their agents died; they are closed as aborted and retired) and sessions finished
        without a reward (the process that would have set it died; they are retired, and a late
        `set_reward` on one is a ConflictError). Rewarded and failed members are kept. The queue
        is rebuilt from the groups themselves, so no request is lost or doubled.

        `owner` (a restarted router's id): only the sessions that router opened and that are still
        open are closed, and only their places queued (added to the queue, which other parts keep
        using): the other routers' sessions live on, and the rollout side still sets its rewards."""
        k = self.keys
        if owner is None:
            await self.redis.delete(k.regenerate)
        group_ids = [k.group_id_from_key(key.decode()) async for key in self.redis.scan_iter(match=k.groups_pattern())]
        pipe = self.redis.pipeline(transaction=False)
        for gid in group_ids:
            pipe.hmget(k.group(gid), _RECOVER_READ)
            pipe.hgetall(k.members(gid))
        replies = iter(await pipe.execute())
        open_groups: list[tuple[str, bytes]] = []  # (group id, metadata) of each RECOVER call
        calls = []  # concurrent script calls: the batcher sends them in one round trip
        for gid in group_ids:
            group, members = hash_fields(_RECOVER_READ, next(replies)), next(replies)
            if group["state"] != b"open" or group["trainable"] == b"0":  # a group's state, not a session status
                continue
            held = _sessions_by_index(members)
            keys = [k.group(gid), k.members(gid), k.stats, *(k.session(sid) for _, sid in held)]
            script, whose = ("RECOVER", []) if owner is None else ("RECOVER_OWNED", [owner])
            calls.append(self._run(script, keys, [time.time(), *whose, *(x for pair in held for x in pair)]))
            open_groups.append((gid, required(group, "metadata")))
        requests = [
            RegenerateRequest(gid, orjson.loads(metadata), [int(i) for i in free], None, None)
            for (gid, metadata), free in zip(open_groups, await asyncio.gather(*calls), strict=True)
            if free
        ]
        if requests:
            await self.redis.rpush(k.regenerate, *(orjson.dumps(asdict(r)) for r in requests))
        return requests

    async def pop_regenerate(self, n: int = 1) -> list[RegenerateRequest]:
        """Pop up to `n` requests to generate a reopened group's stale members again (oldest first)."""
        # LPOP with a count replies with a list (or None when the list is empty)
        items = cast("list[bytes] | None", await self.redis.lpop(self.keys.regenerate, n)) or []
        return [RegenerateRequest(**orjson.loads(item)) for item in items]


async def run_ids(url: str) -> list[str]:
    """Every run in the database at `url` (each has a stats hash once it was written to)."""
    redis = Redis.from_url(url, driver_info=DriverInfo())
    try:
        return sorted([run_id_from_stats_key(k.decode()) async for k in redis.scan_iter(match=run_ids_pattern())])
    finally:
        await redis.aclose()


def _sessions_by_index(members: dict[bytes, bytes]) -> list[tuple[int, str]]:
    """A members hash (index -> session id) as (index, session id) pairs, by index."""
    return sorted((int(index), sid.decode()) for index, sid in members.items())


def _decode_turns(stored: Mapping[Any, bytes | str]) -> list[PackedTurn]:
    return sorted((decode_turn(t) for t in hash_values(stored)), key=lambda t: t.turn_index)


def _decode_member(headers: dict[bytes, bytes], turns: dict[bytes, bytes], reward: bytes | None) -> list[Sample]:
    if not headers:  # open or failed: nothing to train on
        return []
    value = orjson.loads(reward) if reward else None
    return assemble(_decode_turns(turns), [decode_sample_header(h) for h in hash_values(headers)], value)


def _member(
    index: int, session_id: str, headers: dict[bytes, bytes], turns: dict[bytes, bytes], session: Fields
) -> Member:
    samples = _decode_member(headers, turns, session["reward"])
    status = Status(required(session, "status").decode())
    return Member(index, session_id, status, samples, float(session["created_at"] or 0))
