"""`Buffer`: the async client the router (writes), rollout side and trainer (reads) share.

One `Buffer` per process, created from a Redis URL and a run id. Writes that must go together
run as one Lua script (atomic in Redis), and concurrent calls share pipelines; token arrays
travel as packed bytes once, with their turn (finishing a session sends only sample headers),
never per token. Trainable groups are entries of a Redis stream
read through a consumer group, which gives exactly-once training: an entry handed out and not
acknowledged stays pending and is handed out again (see `take_groups`, which `Buffer` passes to
its `consume.GroupConsumer`); an acknowledged one is deleted.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, cast

import orjson
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.driver_info import DriverInfo
from redis.exceptions import ConnectionError, TimeoutError

from slimeish.buffer.batching import ScriptBatcher
from slimeish.buffer.codec import decode_member, decode_turns, encode_sample_header, encode_turn
from slimeish.buffer.config import FILTER_SIGNATURE, BufferConfig
from slimeish.buffer.consume import GroupConsumer
from slimeish.buffer.errors import BufferInputError, UnknownSessionError
from slimeish.buffer.group_scripts import RECOVER, RECOVER_OWNED, RecoverArgs, RecoverKeys, RecoverOwnedArgs
from slimeish.buffer.keys import Keys, run_id_from_stats_key, run_ids_pattern
from slimeish.buffer.records import PackedTurn, RegenerateRequest, SessionInfo, TakeResult, Turn
from slimeish.buffer.replies import (
    as_bytes,
    hash_fields,
    required,
    sessions_by_index,
)
from slimeish.buffer.rules import GroupFilter
from slimeish.buffer.scripts import (
    ABORT_SESSION,
    APPEND_TURN,
    FINISH_SESSION,
    OPEN_SESSION,
    REVOKE_TURNS,
    SET_REWARD,
    AbortArgs,
    AbortKeys,
    AppendArgs,
    FinishArgs,
    FinishKeys,
    OpenArgs,
    RevokeArgs,
    RewardArgs,
    SessionKeys,
    TurnKeys,
)
from slimeish.buffer.segments import PackedSample, build_samples, check_next_turn, split_teacher_log_probs
from slimeish.buffer.stats import BufferStats, read_stats
from slimeish.buffer.views import GroupView, SessionView, group_view, session_view
from slimeish.common.plugins import load_function
from slimeish.common.sample import Sample, Status

# The fields each read takes from a session or group hash (keys.py lists them all).
_FINISH_READ = ("status", "n_turns", "index", "group_seq", "metadata", "group_id")
_RECOVER_READ = ("state", "trainable", "metadata")


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
        self._scripts = ScriptBatcher(self.redis)
        if self.config.group_filter_path and group_filter is not None:
            raise ValueError("give a group filter by group_filter_path or as a function, not both")
        if self.config.group_filter_path:
            group_filter = load_function(
                self.config.group_filter_path,
                expected=FILTER_SIGNATURE,
                params=["group_id", "samples"],
                is_async=False,
            )
        self._consumer = GroupConsumer(self.redis, self.keys, self.config, self._scripts, group_filter)
        self._turns: dict[str, list[PackedTurn]] = {}  # turns this process appended to still-open sessions

    async def aclose(self) -> None:
        await self.redis.aclose()

    async def __aenter__(self) -> Buffer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- writes: router and rollout side ---------------------------------------------------------

    async def open_session(self, info: SessionInfo) -> bool:
        """Register a session in its group (created on first use). False if it was already open (retry)."""
        info.validate()
        k, sid, gid = self.keys, info.session_id, info.group_id
        args = OpenArgs(
            session_id=sid,
            group_id=gid,
            member_index=info.index,
            group_size=info.group_size,
            metadata_json=_json(info.metadata, "metadata"),
            now=time.time(),
            trainable=int(info.trainable),
            owner=info.owner,
        )
        keys = SessionKeys(session=k.session(sid), group=k.group(gid), members=k.members(gid), stats=k.stats)
        return bool(await self._scripts.run(OPEN_SESSION, keys, args))

    async def append_turn(self, turn: Turn, epoch: int = 0) -> bool:
        """Store one turn. Turns arrive in order; a retried identical turn is stored once (returns False).
        `epoch`: the session's write epoch (0 until `revoke_turns`); a write from an older one is
        refused with StaleWriteError."""
        packed = turn.pack()
        cached = self._turns.get(turn.session_id, [])
        if len(cached) < turn.turn_index:  # appended by another process (or before a restart): read them
            cached = self._turns[turn.session_id] = await self._load_turns(turn.session_id)
        earlier = cached[: turn.turn_index]
        previous = earlier[-1] if earlier and len(earlier) == turn.turn_index else None
        check_next_turn(previous, packed, 1 + max((t.segment_index for t in earlier), default=-1))
        k, sid = self.keys, turn.session_id
        keys = TurnKeys(session=k.session(sid), turns=k.turns(sid), stats=k.stats)
        args = AppendArgs(session_id=sid, turn_index=turn.turn_index, payload=encode_turn(packed), epoch=epoch)
        stored = await self._scripts.run(APPEND_TURN, keys, args)
        if stored and len(cached) == turn.turn_index:
            self._turns.setdefault(turn.session_id, cached).append(packed)
        return bool(stored)

    async def revoke_turns(self, session_id: str, from_index: int, epoch: int) -> bool:
        """Drop the session's turns from `from_index` on and move it to write epoch `epoch` (above
        the current one), so that writes of those turns still on their way are refused: the
        router's undo of turns whose client was told they failed. False if already done (a retry)."""
        k = self.keys
        keys = TurnKeys(session=k.session(session_id), turns=k.turns(session_id), stats=k.stats)
        args = RevokeArgs(session_id=session_id, from_index=from_index, epoch=epoch)
        revoked = bool(await self._scripts.run(REVOKE_TURNS, keys, args))
        self._turns.pop(session_id, None)  # read back on the next write
        return revoked

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
        headers = tuple(part for s in samples for part in (s.segment_index, encode_sample_header(s)))
        args = FinishArgs(
            session_id=session_id, n_turns=n_turns, status=status.value, reward_json=reward_json,
            metadata_json=meta_json, now=time.time(), samples=headers,
        )  # fmt: skip
        sealed = await self._scripts.run(FINISH_SESSION, self._finish_keys(session_id, gid), args)
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
        keys = self._finish_keys(session_id, gid.decode())
        args = RewardArgs(session_id=session_id, reward_json=reward_json, now=time.time())
        return bool(await self._scripts.run(SET_REWARD, keys, args))

    def _finish_keys(self, session_id: str, group_id: str) -> FinishKeys:
        k = self.keys
        return FinishKeys(
            session=k.session(session_id), samples=k.samples(session_id), group=k.group(group_id), stats=k.stats,
            ready=k.ready,
        )  # fmt: skip

    async def abort_session(self, session_id: str) -> bool:
        """Give an open session's place back: the episode was lost to its infrastructure (a worker
        or node died), not failed by its agent. The session is closed as aborted and retired (its
        turns stay stored, never trained on) and its index in the group is free, for a new session
        to generate the member again. False, changing nothing, if the session is no longer open or
        no longer holds its place (aborted before, finished, or freed by `recover_open_groups`)."""
        gid = as_bytes(await self.redis.hget(self.keys.session(session_id), "group_id"))
        if gid is None:
            raise UnknownSessionError(f"unknown session {session_id}")
        keys = AbortKeys(
            session=self.keys.session(session_id), members=self.keys.members(gid.decode()), stats=self.keys.stats
        )
        aborted = bool(await self._scripts.run(ABORT_SESSION, keys, AbortArgs(session_id=session_id, now=time.time())))
        if aborted:
            self._turns.pop(session_id, None)
        return aborted

    # ---- reads --------------------------------------------------------------------------------

    async def _load_turns(self, session_id: str) -> list[PackedTurn]:
        return decode_turns(await self.redis.hgetall(self.keys.turns(session_id)))

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
        return decode_member(headers, turns, reward)

    async def iter_samples(self) -> AsyncIterator[Sample]:
        """Every stored sample of the run (for export and inspection), session by session."""
        async for key in self.redis.scan_iter(match=self.keys.samples_pattern(), count=500):
            for sample in await self.session_samples(self.keys.session_id_from_samples_key(key.decode())):
                yield sample

    async def stats(self) -> BufferStats:
        """Counts of sessions and groups by state, staleness drops, bytes stored."""
        await self._consumer.prepare()
        return await read_stats(self.redis, self.keys)

    # ---- the trainer's side, in consume.py -----------------------------------------------------

    async def take_groups(self, n: int, consumer: str, current_version: int | None = None) -> TakeResult:
        """Hand out up to `n` trainable groups to `consumer`: `GroupConsumer.take_groups`."""
        return await self._consumer.take_groups(n, consumer, current_version)

    async def ack(self, group_ids: Iterable[str]) -> int:
        """Acknowledge trained groups, all or nothing: `GroupConsumer.ack`."""
        return await self._consumer.ack(group_ids)

    async def give_back(self, group_ids: Iterable[str]) -> int:
        """Return taken, unacknowledged groups to the queue, all or nothing: `GroupConsumer.give_back`."""
        return await self._consumer.give_back(group_ids)

    async def note_resume(self, version: int) -> None:
        """A trainer resumes from a checkpoint of weight `version`: `GroupConsumer.note_resume`."""
        await self._consumer.note_resume(version)

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
            held = sessions_by_index(members)
            sessions = tuple(k.session(sid) for _, sid in held)
            keys = RecoverKeys(group=k.group(gid), members=k.members(gid), stats=k.stats, sessions=sessions)
            pairs = tuple(x for pair in held for x in pair)
            if owner is None:
                calls.append(self._scripts.run(RECOVER, keys, RecoverArgs(now=time.time(), held=pairs)))
            else:
                args = RecoverOwnedArgs(now=time.time(), owner=owner, held=pairs)
                calls.append(self._scripts.run(RECOVER_OWNED, keys, args))
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
