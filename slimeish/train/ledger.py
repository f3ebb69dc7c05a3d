"""`trained_groups.jsonl`: which groups each step trained on, the audit trail of exactly-once."""

from __future__ import annotations

import json
from pathlib import Path

from slimeish.buffer import Group
from slimeish.train.metrics import drop_steps_from


class TrainedGroups:
    """One line per step: the ids of the groups it trained on.

    On resume from step S the lines of steps >= S are dropped: the killed run trained on them,
    but no checkpoint kept that training, and the buffer hands those groups out again."""

    def __init__(self, path: Path, keep_before: int):
        self.path = path
        drop_steps_from(path, keep_before)

    def record(self, step: int, groups: list[Group]) -> list[str]:
        ids = [g.group_id for g in groups]
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, "groups": ids}) + "\n")
        return ids
