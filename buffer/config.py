"""Group and staleness rules, applied when a trainer takes groups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimeish.common.config import help_field

FILTER_SIGNATURE = "def keep(group_id: str, samples: list[Sample]) -> bool"


@dataclass(kw_only=True, slots=True)
class BufferConfig:
    failed_policy: Literal["drop_group", "keep_successful"] = help_field(
        "drop_group",
        help="a group with failed members is dropped (drop_group) or trained on its successful members "
        "when at least --min-successful succeeded (keep_successful)",
    )
    min_successful: int = help_field(1, help="with keep_successful: fewest successful members a group needs")
    max_staleness: int | None = help_field(
        None,
        help="a group member whose oldest token is more than this many weight versions older than the "
        "trainer's current version is never trained on: the group is reopened and that member generated "
        "again (its fresh members are kept); unset = no bound",
    )
    max_regenerations: int = help_field(
        3,
        help="a group reopened this many times for stale members is dropped the next time instead "
        "(groups_dropped_stale): its episodes outlast the staleness bound, so raise --max-staleness",
    )
    group_filter_path: str | None = help_field(
        None,
        help=f"import path of a group filter, {FILTER_SIGNATURE}; False drops the group "
        "(e.g. buffer.filters.nonzero_reward_variance, DAPO's dynamic sampling)",
    )
    reclaim_after_s: float | None = help_field(
        None,
        help="hand out again groups any consumer took and has not acknowledged for this long (for trainers "
        "that restart under a new consumer name); must exceed the longest time from take to ack, or groups "
        "still being trained are handed out twice; unset = only the same consumer name recovers them",
    )

    def __post_init__(self) -> None:
        if self.min_successful < 1:
            raise ValueError(f"min_successful must be >= 1, got {self.min_successful}")
        if self.max_regenerations < 0:
            raise ValueError(f"max_regenerations must be >= 0, got {self.max_regenerations}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
