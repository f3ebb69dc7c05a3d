"""Read-only views of one run's buffer: groups with their members, one sample with its turns,
the open sessions. Reads go through the documented key layout (`slimeish.buffer.keys`), with
one pipeline per page, and never write: not even the consumer group `Buffer.stats` creates."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

from slimeish.buffer import Buffer, Turn
from slimeish.buffer.codec import decode_sample_header
from slimeish.buffer.keys import run_id_from_stats_key, run_ids_pattern
from slimeish.common.sample import Sample

EPS = 1e-6  # as the trainer's group_normalized_advantages


async def run_ids(redis: Redis) -> list[str]:
    """Every run in the database (each has a stats hash once it was written to)."""
    return sorted([run_id_from_stats_key(k.decode()) async for k in redis.scan_iter(match=run_ids_pattern())])


def _text(value: bytes | None) -> str:
    return value.decode() if value else ""


def _session_view(fields: Mapping[Any, Any]) -> dict[str, Any]:
    """A session hash as JSON-ready values (reward None until it is set)."""
    reward = fields.get(b"reward")
    return {
        "group_id": _text(fields.get(b"group_id")),
        "index": int(fields.get(b"index") or -1),
        "status": _text(fields.get(b"status")),
        "reward": orjson.loads(reward) if reward else None,
        "n_turns": int(fields.get(b"n_turns") or 0),
        "created_at": float(fields.get(b"created_at") or 0),
        "finished_at": float(fields.get(b"finished_at") or 0),
        "retired": b"retired_at" in fields,
        "metadata": orjson.loads(fields.get(b"metadata") or b"{}"),
        "finish_metadata": orjson.loads(fields.get(b"finish_metadata") or b"{}"),
    }


def _segments(headers: Mapping[Any, Any]) -> list[dict[str, Any]]:
    decoded = (decode_sample_header(v) for v in headers.values())
    keep = ("segment_index", "response_length", "split_reason", "weight_versions")
    return sorted(({k: h[k] for k in keep} for h in decoded), key=lambda s: s["segment_index"])


def advantages(rewards: dict[str, float | None]) -> dict[str, float | None]:
    """GRPO's group-normalised advantage per member (one reward per member, unbiased std), as the
    trainer computes it; None for a member without a reward (failed or not yet scored)."""
    scored = [r for r in rewards.values() if r is not None]
    if not scored:
        return dict.fromkeys(rewards)
    mean = statistics.fmean(scored)
    std = statistics.stdev(scored) if len(scored) > 1 else None
    return {m: None if r is None else 0.0 if std is None else (r - mean) / (std + EPS) for m, r in rewards.items()}


@dataclass(slots=True)
class SampleDetail:
    """One stored sample with what explains it: its session and the turns it was built from."""

    sample: Sample
    session: dict[str, Any]
    turns: list[Turn]


class RunReader:
    """The buffer of one run, read for pages."""

    def __init__(self, buffer: Buffer) -> None:
        self.buf = buffer
        self.keys = buffer.keys
        self.redis = buffer.redis

    async def stats(self) -> dict[str, int]:
        raw: Mapping[Any, Any] = await self.redis.hgetall(self.keys.stats)
        return {k.decode(): int(v) for k, v in raw.items()}

    async def groups(self, group_ids: list[str]) -> list[dict[str, Any]]:
        """Each group's state and members (by index), with segments, rewards and advantages."""
        pipe = self.redis.pipeline(transaction=False)
        for gid in group_ids:
            pipe.hgetall(self.keys.group(gid))
            pipe.hgetall(self.keys.members(gid))
        replies = await pipe.execute()
        members = {gid: sorted((int(i), s.decode()) for i, s in replies[2 * n + 1].items())
                   for n, gid in enumerate(group_ids)}  # fmt: skip
        sessions = await self._sessions([sid for ms in members.values() for _, sid in ms])
        return [self._group(gid, replies[2 * n], members[gid], sessions) for n, gid in enumerate(group_ids)]

    async def _sessions(self, session_ids: list[str]) -> dict[str, dict[str, Any]]:
        pipe = self.redis.pipeline(transaction=False)
        for sid in session_ids:
            pipe.hgetall(self.keys.session(sid))
            pipe.hgetall(self.keys.samples(sid))
        replies = await pipe.execute()
        return {
            sid: {"session_id": sid, **_session_view(replies[2 * n]), "segments": _segments(replies[2 * n + 1])}
            for n, sid in enumerate(session_ids)
        }

    @staticmethod
    def _group(gid: str, fields: Mapping[Any, Any], members: list[tuple[int, str]], sessions: dict) -> dict:
        rows = [sessions[sid] for _, sid in members]
        for row, adv in zip(rows, advantages({r["session_id"]: r["reward"] for r in rows}).values(), strict=True):
            row["advantage"] = adv
        return {
            "group_id": gid,
            "state": _text(fields.get(b"state")),
            "size": int(fields.get(b"size") or 0),
            "reopened": int(fields.get(b"reopened") or 0),
            "members": rows,
        }

    async def sample(self, session_id: str, segment_index: int) -> SampleDetail | None:
        samples = await self.buf.session_samples(session_id)
        found = next((s for s in samples if s.segment_index == segment_index), None)
        if found is None:
            return None
        session = _session_view(await self.redis.hgetall(self.keys.session(session_id)))
        turns = [t for t in await self.buf.turns(session_id) if t.segment_index == segment_index]
        return SampleDetail(found, session, turns)

    async def open_sessions(self, limit: int = 500) -> list[dict[str, Any]]:
        """Sessions still open (status pending), oldest first: the episodes in flight."""
        ids = [self._sid(k) async for k in self.redis.scan_iter(match=self.keys.session("*"), count=1000)]
        pipe = self.redis.pipeline(transaction=False)
        for sid in ids:
            pipe.hmget(self.keys.session(sid), "status", "group_id", "index", "n_turns", "created_at")
        rows: list[dict[str, Any]] = [
            {"session_id": sid, "group_id": _text(g), "index": int(i or -1), "n_turns": int(n or 0),
             "created_at": float(c or 0)}
            for sid, (status, g, i, n, c) in zip(ids, await pipe.execute(), strict=True)
            if status == b"pending"
        ]  # fmt: skip
        return sorted(rows, key=lambda r: r["created_at"])[:limit]

    def _sid(self, key: bytes) -> str:
        return key.decode().removeprefix(self.keys.session(""))
