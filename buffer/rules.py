"""Which complete groups a trainer may train on: failed members, staleness, the filter hook.

Staleness is judged per member: a group whose members are fresh except some is not thrown away,
only its stale members are generated again (the group is reopened). Judging the group by its
oldest token instead would throw away every group whose slowest member ends long after its
siblings (their tokens age while it runs), so async training would learn only from groups
without a long episode. Pure functions of a group's members, so the rules are tested without Redis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from slimeish.buffer.config import BufferConfig
from slimeish.common.sample import Sample, Status

GroupFilter = Callable[[str, list[Sample]], bool]


@dataclass(frozen=True, slots=True)
class Member:
    index: int
    session_id: str
    status: Status
    samples: list[Sample]
    created_at: float = 0.0  # when its session was opened


@dataclass(frozen=True, slots=True)
class Resume:
    """A trainer resumed at time `at` from a checkpoint of weight `version`: tokens of newer versions
    from sessions opened before `at` came from weights that run discarded."""

    at: float
    version: int


@dataclass(frozen=True, slots=True)
class Verdict:
    """`state` is "trainable", "reopen" (generate the `stale` members again), or the group's final
    state when it is dropped."""

    state: str
    samples: list[Sample]
    oldest_version: int | None = None
    stale: list[Member] = field(default_factory=list)

    @property
    def keep(self) -> bool:
        return self.state == "trainable"


def oldest_version(samples: list[Sample]) -> int | None:
    versions = [v for s in samples for v in s.weight_versions]
    return min(versions) if versions else None


def _stale(member: Member, current: int, bound: int | None, resumes: list[Resume]) -> bool:
    """Older than the bound, or sampled by weights the trainer does not have: newer than its own, or
    discarded by a resume from an earlier checkpoint (the version numbers after a resume are used
    again, so the session's opening time tells the two runs' tokens apart). No importance weight
    relates such tokens to the trainer's policy."""
    versions = [v for s in member.samples for v in s.weight_versions]
    if not versions:
        return False
    newest = max(versions)
    discarded = any(member.created_at < r.at and newest > r.version for r in resumes)
    return discarded or newest > current or (bound is not None and current - min(versions) > bound)


def _kept(group_filter: GroupFilter, group_id: str, samples: list[Sample]) -> bool:
    """The filter's verdict; anything but a bool is an error (an object would read as true)."""
    keep = group_filter(group_id, samples)
    if not isinstance(keep, bool):
        raise TypeError(f"the group filter returned {type(keep).__name__} ({keep!r}); expected a bool")
    return keep


def judge(
    group_id: str,
    members: list[Member],
    config: BufferConfig,
    current_version: int | None,
    group_filter: GroupFilter | None = None,
    reopened: int = 0,
    resumes: list[Resume] | None = None,
) -> Verdict:
    """Apply, in order: the failed-member policy, staleness (per member, see `_stale`; a group
    already `reopened` `max_regenerations` times is dropped instead), the filter hook."""
    ok = [m for m in members if m.status is not Status.FAILED and m.samples]
    failed = len(members) - len(ok)
    if failed and (config.failed_policy == "drop_group" or len(ok) < config.min_successful):
        return Verdict("dropped_failed", [])
    samples = [s for m in ok for s in m.samples]
    oldest = oldest_version(samples)
    if current_version is not None:
        stale = [m for m in ok if _stale(m, current_version, config.max_staleness, resumes or [])]
        if stale and reopened >= config.max_regenerations:
            return Verdict("dropped_stale", [], oldest)
        if stale:
            return Verdict("reopen", [], oldest, stale)
    if group_filter is not None and not _kept(group_filter, group_id, samples):
        return Verdict("filtered", [])
    return Verdict("trainable", samples, oldest)
