"""Every Redis key the buffer uses, built in one place and namespaced by run id.

Layout for run `R` (see docs/buffer.md):

    slimeish:R:session:<sid>   hash    group_id, index, group_size, status, reward, metadata, times, n_turns
    slimeish:R:turns:<sid>     hash    turn_index -> msgpack Turn (token arrays as packed bytes)
    slimeish:R:samples:<sid>   hash    segment_index -> msgpack sample header (arrays rebuilt from the turns)
    slimeish:R:group:<gid>     hash    size, seq, state, done, failed, metadata, entry (stream id)
    slimeish:R:members:<gid>   hash    index -> session id
    slimeish:R:ready           stream  one entry per trainable group; consumer group "trainers"
    slimeish:R:regenerate      list    JSON requests for groups dropped as stale
    slimeish:R:stats           hash    counters
    slimeish:R:resumes         list    JSON {at, version}: a trainer resumed at `at` from a checkpoint of `version`
"""

from __future__ import annotations

PREFIX = "slimeish"
CONSUMER_GROUP = "trainers"  # the stream consumer group all trainer processes share


class Keys:
    """Key builder for one run; a run id may not contain ':' so prefixes never overlap."""

    __slots__ = ("base", "ready", "regenerate", "resumes", "run_id", "stats")

    def __init__(self, run_id: str) -> None:
        if not run_id or ":" in run_id:
            raise ValueError(f"run id {run_id!r} must be non-empty and contain no ':'")
        self.run_id = run_id
        self.base = f"{PREFIX}:{run_id}"
        self.ready = f"{self.base}:ready"
        self.regenerate = f"{self.base}:regenerate"
        self.stats = f"{self.base}:stats"
        self.resumes = f"{self.base}:resumes"

    def session(self, session_id: str) -> str:
        return f"{self.base}:session:{session_id}"

    def turns(self, session_id: str) -> str:
        return f"{self.base}:turns:{session_id}"

    def samples(self, session_id: str) -> str:
        return f"{self.base}:samples:{session_id}"

    def group(self, group_id: str) -> str:
        return f"{self.base}:group:{group_id}"

    def members(self, group_id: str) -> str:
        return f"{self.base}:members:{group_id}"

    def groups_pattern(self) -> str:
        """SCAN pattern for every group hash (used by recovery after a crash)."""
        return f"{self.base}:group:*"

    def group_id_from_key(self, key: str) -> str:
        return key.removeprefix(f"{self.base}:group:")

    def samples_pattern(self) -> str:
        """SCAN pattern for every session's samples hash (used by export)."""
        return f"{self.base}:samples:*"

    def session_id_from_samples_key(self, key: str) -> str:
        return key.removeprefix(f"{self.base}:samples:")


def run_ids_pattern() -> str:
    """SCAN pattern matching the stats hash of every run (each run has one once it is written to)."""
    return f"{PREFIX}:*:stats"


def run_id_from_stats_key(key: str) -> str:
    return key.removeprefix(f"{PREFIX}:").removesuffix(":stats")
