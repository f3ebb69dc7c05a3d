"""Which complete groups a trainer may train on: failed members, staleness, the filter hook.

Pure functions of a group's members, so the rules are tested without Redis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from buffer.config import BufferConfig
from buffer.records import SessionStatus
from slimeish.types import Sample

GroupFilter = Callable[[str, list[Sample]], bool]


@dataclass(frozen=True, slots=True)
class Member:
    status: SessionStatus
    samples: list[Sample]


@dataclass(frozen=True, slots=True)
class Verdict:
    """`state` is "trainable" or the group's final state when it is dropped."""

    state: str
    samples: list[Sample]
    oldest_version: int | None = None

    @property
    def keep(self) -> bool:
        return self.state == "trainable"


def oldest_version(samples: list[Sample]) -> int | None:
    versions = [v for s in samples for v in s.weight_versions]
    return min(versions) if versions else None


def judge(
    group_id: str,
    members: list[Member],
    config: BufferConfig,
    current_version: int | None,
    group_filter: GroupFilter | None = None,
) -> Verdict:
    """Apply, in order: the failed-member policy, the staleness bound, the filter hook."""
    ok = [m for m in members if m.status is not SessionStatus.FAILED and m.samples]
    failed = len(members) - len(ok)
    if failed and (config.failed_policy == "drop_group" or len(ok) < config.min_successful):
        return Verdict("dropped_failed", [])
    samples = [s for m in ok for s in m.samples]
    oldest = oldest_version(samples)
    bound = config.max_staleness
    if bound is not None and current_version is not None and oldest is not None and current_version - oldest > bound:
        return Verdict("dropped_stale", [], oldest)
    if group_filter is not None and not group_filter(group_id, samples):
        return Verdict("filtered", [])
    return Verdict("trainable", samples, oldest)
