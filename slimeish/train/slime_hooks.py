"""slime's rollout-side hooks by import path, with slime's signatures, called where slime calls them.

- `--custom-config-path`: a YAML whose keys land on `args` (slime sets each with `setattr`, over
  any flag); a key that names a `slimeish train` option also sets that option.
- `--data-source-path`: slime's data source class, built as `cls(args)`; it serves each new
  group (`get_samples`), takes groups back (`add_samples`), and saves and loads its own state
  with each checkpoint (`save(rollout_id)`, `load(rollout_id)`). slimeish numbers the groups it
  serves and serves a reopened group's members again first, as with its own prompts.
- `--eval-function-path`: the rollout function evaluation calls (default: the rollout function).
- `--rollout-sample-filter-path`: called on the groups of a training step; the samples it marks
  `remove_sample` keep their place in the group's advantages but train on no token (slime zeroes
  their loss mask when it converts samples to train data).
- `--custom-rollout-log-function-path`, `--custom-eval-rollout-log-function-path`: called with the
  step's samples (or the evaluation's datasets) before the metrics are logged; returning True
  leaves slime's default metrics out of the line (`rollout/`, `perf/`, `episodes/`; `eval/`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slimeish.common.config import help_field, load_yaml
from slimeish.common.plugins import load_function
from slimeish.common.sample import Sample
from slimeish.data import DataSource
from slimeish.rollout import ROLLOUT_SIGNATURE, load_rollout_function

SAMPLE_FILTER_SIGNATURE = "def filter(args, samples: list[list[Sample]]) -> None  # sets sample.remove_sample"
ROLLOUT_LOG_SIGNATURE = "def log_rollout_data(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool"
EVAL_LOG_SIGNATURE = "def log_eval_rollout_data(rollout_id, args, data, extra_metrics) -> bool"
# The metric prefixes slime's default rollout logging writes (a custom log function returning True skips them).
DATA_SOURCE_SIGNATURE = (
    "class DataSource: __init__(self, args); get_samples(self, num_samples) -> list[list[Sample]]; "
    "add_samples(self, samples: list[list[Sample]]); save(self, rollout_id); load(self, rollout_id=None)"
)
DEFAULT_ROLLOUT_METRICS = ("rollout/", "perf/", "episodes/")


@dataclass(kw_only=True)
class SlimeHooksConfig:
    custom_config_path: Path | None = help_field(
        None, help="slime's YAML of plugin options: each key is set on args, over any flag (default: None)"
    )
    data_source_path: str | None = help_field(
        None, help=f"slime's data source class, serving the prompts instead of --prompt-data: {DATA_SOURCE_SIGNATURE}"
    )
    eval_function_path: str | None = help_field(
        None, help=f"the rollout function evaluation calls (default: --rollout-function-path): {ROLLOUT_SIGNATURE}"
    )
    rollout_sample_filter_path: str | None = help_field(
        None,
        help=f"marks samples of a training step to train on no token (still in their group's advantages): "
        f"{SAMPLE_FILTER_SIGNATURE} (default: None)",
    )
    custom_rollout_log_function_path: str | None = help_field(
        None,
        help=f"called with each step's samples before its metrics are logged; True leaves out the default "
        f"rollout/, perf/ and episodes/ metrics: {ROLLOUT_LOG_SIGNATURE} (default: None)",
    )
    custom_eval_rollout_log_function_path: str | None = help_field(
        None,
        help=f"called with each evaluation's datasets before its metrics are logged; True leaves out the default "
        f"eval/ metrics: {EVAL_LOG_SIGNATURE} (default: None)",
    )


def custom_config(cfg: SlimeHooksConfig) -> dict[str, Any]:
    """The --custom-config-path YAML's keys and values (none without one)."""
    return load_yaml(cfg.custom_config_path) if cfg.custom_config_path is not None else {}


def with_custom_config(config: Any, custom: dict[str, Any]) -> Any:
    """`config` with the fields the custom config names set from it (slime: they win over flags)."""
    names = {f.name for f in dataclasses.fields(config)}
    return dataclasses.replace(config, **{k: v for k, v in custom.items() if k in names})


@dataclass
class SlimeHooks:
    """The loaded hooks of one run; None where the flag was not given."""

    eval_fn: Callable[..., Any] | None = None
    sample_filter: Callable[..., Any] | None = None
    rollout_log: Callable[..., Any] | None = None
    eval_log: Callable[..., Any] | None = None

    @classmethod
    def load(cls, cfg: SlimeHooksConfig) -> SlimeHooks:
        """Import each given hook and check its signature (errors state the expected one)."""

        def load(path: str | None, expected: str, params: list[str]) -> Callable[..., Any] | None:
            return load_function(path, expected=expected, params=params, is_async=False) if path else None

        return cls(
            eval_fn=load_rollout_function(cfg.eval_function_path) if cfg.eval_function_path else None,
            sample_filter=load(cfg.rollout_sample_filter_path, SAMPLE_FILTER_SIGNATURE, ["args", "samples"]),
            rollout_log=load(
                cfg.custom_rollout_log_function_path,
                ROLLOUT_LOG_SIGNATURE,
                ["rollout_id", "args", "samples", "rollout_extra_metrics", "rollout_time"],
            ),
            eval_log=load(
                cfg.custom_eval_rollout_log_function_path, EVAL_LOG_SIGNATURE, ["rollout_id", "args", "data", "extra"]
            ),
        )

    def filter_samples(self, args: Any, groups: list[list[Sample]]) -> None:
        """Run the sample filter on a step's groups; a removed sample trains on no token."""
        if self.sample_filter is None:
            return
        self.sample_filter(args, groups)
        for sample in (s for g in groups for s in g):
            if sample.remove_sample:
                sample.loss_mask = [0] * sample.response_length

    def log_rollout(
        self, rollout_id: int, args: Any, samples: list[Sample], metrics: dict[str, Any], rollout_time: float
    ) -> dict[str, Any]:
        """A step's metrics as they are logged: without the default ones when the log function says so.
        slime passes the rollout function's own metrics as `rollout_extra_metrics`."""
        if self.rollout_log is None:
            return metrics
        extra = {k: v for k, v in metrics.items() if k.startswith(("episodes/", "rollout/dynamic_filter/"))}
        if self.rollout_log(rollout_id, args, samples, extra, rollout_time):
            return {k: v for k, v in metrics.items() if not k.startswith(DEFAULT_ROLLOUT_METRICS)}
        return metrics

    def log_eval(
        self, rollout_id: int, args: Any, data: dict[str, Any], extra: dict[str, Any], metrics: dict[str, Any]
    ) -> dict[str, Any]:
        """An evaluation's metrics as they are logged: none of the default ones when the log function says
        so. `extra` is the eval function's own metrics (slime's `extra_metrics`)."""
        if self.eval_log is not None and self.eval_log(rollout_id, args, data, extra):
            return {}
        return metrics


def load_data_source_class(path: str) -> type[Any]:
    """Import a --data-source-path class and check it has slime's data source methods."""
    cls = load_function(path, expected=DATA_SOURCE_SIGNATURE, params=["args"])
    missing = [m for m in ("get_samples", "add_samples", "save", "load") if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        raise ValueError(
            f"plugin {path!r} is not a data source class (missing {missing}); expected {DATA_SOURCE_SIGNATURE}"
        )
    return cls


class PluginDataSource(DataSource):
    """A slime data source behind slimeish's: the plugin serves each new group, one at a time;
    slimeish gives it its group number (buffer groups never repeat, also across a resume) and its
    members their index in the group, and serves regenerated members first."""

    def __init__(self, source: Any, n_samples_per_prompt: int, *, state_path: Path | None = None):
        super().__init__([], n_samples_per_prompt, shuffle=False, state_path=state_path)
        self.source = source

    def _next_group(self) -> list[Sample]:
        if self._returned:
            return super()._next_group()
        (group,) = self.source.get_samples(1)
        if len(group) != self.n_samples_per_prompt:
            raise ValueError(f"the data source served a group of {len(group)}; expected --n-samples-per-prompt")
        for index, sample in enumerate(group):
            sample.group_index, sample.index = self.next_group_index, index
        self.next_group_index += 1
        return list(group)

    def add_samples(self, groups: list[list[Sample]]) -> None:
        self.source.add_samples(groups)

    def save(self, rollout_id: int) -> None:
        self.source.save(rollout_id)

    def load(self, rollout_id: int) -> None:
        self.source.load(rollout_id)
