"""What a dynamic sampling filter returns (`--dynamic-sampling-filter-path`), as slime defines it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class DynamicFilterOutput:
    """`keep`: train on the group (a bool, or a one-element tensor as slime's own filters return);
    `reason`: counted in metrics as `rollout/dynamic_filter/drop_<reason>` when dropped;
    `keep_when_insufficient`: keep it anyway when dropping it would leave the batch short, which
    is always the case here (slimeish generates exactly the missing groups, no over-sampling)."""

    keep: Any
    reason: str | None = None
    keep_when_insufficient: bool = False
