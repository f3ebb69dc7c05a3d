"""A training step's `episodes/` metrics: what the rollout calls that finished since the previous
step reported, merged into one line.

One step can take several rollout calls: async mode runs one call per group, and sync mode calls
again for groups that were filtered, failed or reopened as stale. Logging the last call's metrics
would report one group's `failed` for a whole step, so they are merged by kind:
- counts (`SUMMED`, `harness_<kind>`, and any key ending in `_count`) are summed;
- `reward_mean` and `reward_std` are pooled over the calls' rewarded episodes, exactly (each call
  reports its population mean and std and the count `rewarded` they are over);
- any other key is the mean over the calls that reported it (the last value if one is not a number).
A custom rollout function's metrics follow the same rules; one call's are logged as it returned them.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

POOLED = ("reward_mean", "reward_std")
# The count `reward_mean` and `reward_std` are over; without it they are averaged like any key.
POOLED_OVER = "rewarded"
SUMMED = frozenset({"episodes", "failed", "truncated", "regenerated", POOLED_OVER})
SUMMED_PREFIXES = ("harness_",)
SUMMED_SUFFIX = "_count"  # how a custom rollout function names a count of its own


def merged(calls: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The calls' metrics as one step's (see the module's rules); {} for no call."""
    if len(calls) == 1:
        return dict(calls[0])
    reporting = [call for call in calls if any(k in call for k in POOLED)]
    pooled = bool(reporting) and all(k in call for call in reporting for k in (*POOLED, POOLED_OVER))
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for call in calls for k in call):  # first-seen order: a stable log line
        values = [call[key] for call in calls if key in call]
        if not all(isinstance(v, numbers.Real) for v in values):
            out[key] = values[-1]
        elif key in SUMMED or key.startswith(SUMMED_PREFIXES) or key.endswith(SUMMED_SUFFIX):
            out[key] = float(sum(values))
        elif not (pooled and key in POOLED):
            out[key] = sum(values) / len(values)
    if pooled:
        out |= _pooled_rewards(reporting)
    return out


def _pooled_rewards(calls: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean and population std of all the calls' rewards, from each call's count, mean and std."""
    n = sum(call[POOLED_OVER] for call in calls)
    if n == 0:
        return {"reward_mean": 0.0, "reward_std": 0.0}  # what one call with no reward reports
    mean = sum(call[POOLED_OVER] * call["reward_mean"] for call in calls) / n
    second_moment = sum(call[POOLED_OVER] * (call["reward_std"] ** 2 + call["reward_mean"] ** 2) for call in calls) / n
    return {"reward_mean": mean, "reward_std": math.sqrt(max(second_moment - mean**2, 0.0))}
