"""What a run is made of: the typed configs, `slimeish train`'s flags for them, and the `args`
namespace rollout plugins receive.

Each part owns its config dataclass; `TrainSetup` holds one of each, plus the config the rollout
function declares for itself (docs/rollout.md), so the flags a plugin reads appear only when that
plugin is the one that runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from slimeish.buffer import BufferConfig
from slimeish.cluster import ClusterConfig
from slimeish.common.config import add_dataclass_args, from_namespace, help_field, load_yaml
from slimeish.common.plugins import load_function
from slimeish.data import DataConfig, read_prompts
from slimeish.rollout import (
    RolloutConfig,
    check_rollout_config,
    load_generate_function,
    load_reward_function,
    load_rollout_function,
    rollout_config_type,
)
from slimeish.rollout.dynamic_filter import DynamicFilter
from slimeish.rollout.rewards import load_post_process
from slimeish.rollout.rm_hub import ASYNC_RM_PATH, check_rm_type
from slimeish.rollout.run_state import RUN_ARG, RolloutRun
from slimeish.rollout.sample_hooks import load_sample_hooks
from slimeish.train.launch import StackConfig
from slimeish.train.model_args import check_model_args
from slimeish.train.slime_flags import SlimeConfig, SlimeFlagError, translate
from slimeish.train.slime_hooks import (
    SlimeHooks,
    SlimeHooksConfig,
    custom_config,
    load_data_source_class,
    with_custom_config,
)
from slimeish.trainer.config import LossConfig, TrainerConfig
from slimeish.trainer.megatron_hooks import MegatronHooks

DESCRIPTION = "`slimeish train`: start the parts, then generate → train → sync weights, in one loop."


@dataclass(kw_only=True)
class RunConfig:
    run_dir: Path = help_field(Path("runs/latest"), help="directory for logs, checkpoints, metrics and the buffer")
    run_id: str | None = help_field(None, help="buffer namespace of this run (default: the run dir's name)")
    mode: Literal["sync", "async"] = help_field("sync", help="sync: generate, then train; async: both at once")
    num_rollout: int = help_field(10, help="rollout steps (one training step each)")
    num_epoch: int | None = help_field(
        None,
        help="slime's epochs over --prompt-data: --num-rollout becomes num_epoch x prompts // rollout_batch_size "
        "(a --num-rollout given wins, as in slime) (default: None)",
    )
    debug_rollout_only: bool = help_field(
        False, help="slime's rollout-only run: each step generates and logs its groups, with no training or weight sync"
    )
    eval_interval: int | None = help_field(None, help="evaluate on --eval-prompt-data every N steps (and first/last)")
    save_interval: int | None = help_field(None, help="save a checkpoint every N steps (and at the end)")
    save: Path | None = help_field(
        None, help="slime's --save: the folder checkpoints are written to (default: <run-dir>/checkpoints)"
    )
    load: Path | None = help_field(
        None,
        help="resume from this checkpoint directory, or a checkpoints folder's latest (slime's --load; the same "
        "folder as --save starts fresh while it holds none) (default: the run dir's checkpoints/latest when there "
        "is one, so running the same command again resumes)",
    )
    fresh: bool = help_field(False, help="start at step 0 even if the run dir holds a checkpoint")
    async_groups: int | None = help_field(
        None,
        help="async mode: most groups generated but not yet trained (default: 2 x (max_staleness + 1) x "
        "rollout_batch_size); --rollout-concurrency still bounds the episodes, and the slack keeps episode "
        "slots busy with other groups while a group's slowest member runs",
    )
    custom_update_weight_post_write_path: str | None = help_field(
        None,
        help="--weight-sync disk: slime's hook run once a version's files are written, before the engines load them: "
        "def hook(args, version_dir, rollout_engines) -> None (default: None)",
    )
    weight_sync: Literal["tensor", "disk", "distributed"] = help_field(
        "tensor",
        help="tensor: same-host shared-memory update (embedded engines); disk: export an HF checkpoint the "
        "engines load (SGLang: a shared filesystem); distributed: NCCL broadcast to SGLang engines (GPU)",
    )

    @property
    def checkpoints(self) -> Path:
        return self.save or self.run_dir / "checkpoints"

    def checkpoint_to_load(self) -> Path | None:
        """`--load`, else the run dir's latest checkpoint unless `--fresh`: a supervisor (systemd,
        Kubernetes, Slurm --requeue) restarts a killed trainer with the same command, and it resumes.
        A `--load` that is a checkpoints folder (slime's: its --save) resumes from its latest one, and
        is a fresh start while it holds none yet when it is this run's --save (slime's first run)."""
        if self.load is not None:
            if (self.load / "latest").exists():
                return self.load / "latest"
            if self.load == self.save and not any(self.load.glob("step_*")):
                return None
            return self.load
        latest = self.checkpoints / "latest"
        return latest if latest.exists() and not self.fresh else None


# Flag group title -> config type, in --help order; the name is also the TrainSetup attribute.
CONFIGS: dict[str, type[Any]] = {
    "run": RunConfig,
    "data": DataConfig,
    "rollout": RolloutConfig,
    "buffer": BufferConfig,
    "stack": StackConfig,
    "cluster": ClusterConfig,
    "trainer": TrainerConfig,
    "loss": LossConfig,
    "slime": SlimeConfig,
    "slime_hooks": SlimeHooksConfig,
}


@dataclass(kw_only=True)
class TrainSetup:
    """Everything `slimeish.train.run` needs. `plugin` is an instance of the config dataclass the
    rollout function's module declares (`ROLLOUT_CONFIG`), or None where it declares none."""

    trainer: TrainerConfig
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    buffer: BufferConfig = dataclasses.field(default_factory=BufferConfig)
    stack: StackConfig = dataclasses.field(default_factory=StackConfig)
    cluster: ClusterConfig = dataclasses.field(default_factory=ClusterConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    slime: SlimeConfig = dataclasses.field(default_factory=SlimeConfig)
    slime_hooks: SlimeHooksConfig = dataclasses.field(default_factory=SlimeHooksConfig)
    plugin: Any = None

    def __post_init__(self) -> None:
        if self.data.apply_chat_template and self.data.tokenizer_path is None:  # the policy's tokenizer
            self.data = dataclasses.replace(self.data, tokenizer_path=self.trainer.model_path)
        if self.slime.rm_type and not self.rollout.custom_rm_path:  # slime: --rm-type picks a built-in reward
            self.rollout = dataclasses.replace(self.rollout, custom_rm_path=ASYNC_RM_PATH)
        if self.trainer.lora_rank and self.run.weight_sync == "distributed":  # refused now, not at the first sync
            raise ValueError("--lora-rank pushes a PEFT adapter the engines load by path: --weight-sync tensor or disk")

    def configs(self) -> dict[str, Any]:
        """Each config by its group name (the plugin's last, when there is one)."""
        named = {name: getattr(self, name) for name in CONFIGS}
        return named if self.plugin is None else named | {"plugin": self.plugin}

    def values(self) -> dict[str, Any]:
        """Every option by its flag name (underscores): the names are unique across the configs."""
        return {k: v for cfg in self.configs().values() for k, v in fields_of(cfg).items()}


def parse_args(argv: list[str] | None, base: TrainSetup | None = None) -> TrainSetup:
    """`slimeish train`'s flags -> `TrainSetup`. Values come from the flags, then the `--config`
    YAML, then `base` (a program's own preset), then the defaults.

    The rollout function is loaded first (from a pre-parse of `--rollout-function-path` and
    `--config`), so the flags its module declares are parsed and shown under its name. slime's
    flag names are translated first (`slime_flags`); a refused one exits 2 saying why."""
    notes: list[str] = []
    try:
        argv = translate(sys.argv[1:] if argv is None else argv, notes)
    except SlimeFlagError as exc:
        argparse.ArgumentParser(prog="slimeish train").error(str(exc))
    for note in notes:  # accepted slime flags that change nothing here: said, never silent
        print(f"slimeish train: {note}", file=sys.stderr)
    defaults = base.values() if base is not None else {}
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", type=Path)
    pre.add_argument("--rollout-function-path")
    known, _ = pre.parse_known_args(argv)
    yaml_values = load_yaml(known.config) if known.config else {}
    rollout_path = known.rollout_function_path or yaml_values.get("rollout_function_path")
    rollout_path = rollout_path or defaults.get("rollout_function_path") or RolloutConfig().rollout_function_path
    plugin_type = rollout_config_type(rollout_path)

    parser = argparse.ArgumentParser(prog="slimeish train", description=DESCRIPTION)
    parser.add_argument("--config", type=Path, help="YAML file with any of the options below (flags win)")
    for name, cls in CONFIGS.items():
        add_dataclass_args(parser, cls, name)
    if plugin_type is not None:
        _check_no_clash(plugin_type, rollout_path)
        add_dataclass_args(parser, plugin_type, plugin_title(rollout_path))
    ns = parser.parse_args(argv)
    values = defaults | yaml_values
    known_names = {f.name for cls in [*CONFIGS.values(), plugin_type] if cls for f in dataclasses.fields(cls)}
    if unknown := set(yaml_values) - known_names:
        parser.error(f"{ns.config}: unknown option(s) {', '.join(sorted(unknown))}")
    try:
        configs = {name: from_namespace(cls, ns, values) for name, cls in CONFIGS.items()}
        plugin = from_namespace(plugin_type, ns, values) if plugin_type is not None else None
        # slime sets --custom-config-path's keys over the flags: those naming an option set it too.
        custom = custom_config(configs["slime_hooks"])
        configs = {name: with_custom_config(cfg, custom) for name, cfg in configs.items()}
        plugin = with_custom_config(plugin, custom) if plugin is not None else None
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    setup = TrainSetup(**configs, plugin=plugin)
    if setup.loss.loss_type == "sft_loss" and ns.n_samples_per_prompt is None and "n_samples_per_prompt" not in values:
        # Nothing is sampled for SFT: a prompt's group is its one conversation (slime's default group size).
        setup.rollout = dataclasses.replace(setup.rollout, n_samples_per_prompt=1)
    if setup.run.num_epoch and ns.num_rollout is None and "num_rollout" not in values:
        setup.run = dataclasses.replace(setup.run, num_rollout=epochs_to_rollouts(setup))
    if setup.data.prompt_data is None and not setup.slime_hooks.data_source_path:  # before any process starts
        parser.error("--prompt-data (or --data-source-path) is required")
    setup.trainer = lr_schedule(setup)
    return setup


def lr_schedule(setup: TrainSetup) -> TrainerConfig:
    """The trainer's config with Megatron's schedule defaults over the run's optimizer steps (slime's train
    iterations): --lr-warmup-fraction of them warm up, and an unset --lr-decay-steps decays over the rest."""
    t, r = setup.trainer, setup.rollout
    per_rollout = r.rollout_batch_size * r.n_samples_per_prompt // t.global_batch_size if t.global_batch_size else 1
    total = setup.run.num_rollout * per_rollout
    warmup = t.lr_warmup_steps if t.lr_warmup_fraction is None else int(t.lr_warmup_fraction * total)
    decay = t.lr_decay_steps
    if decay is None and t.lr_decay_style != "constant":
        decay = max(1, total - warmup)
    return dataclasses.replace(t, lr_warmup_steps=warmup, lr_decay_steps=decay)


def epochs_to_rollouts(setup: TrainSetup) -> int:
    """slime's --num-epoch: the rollout steps that serve every prompt that many times."""
    if setup.data.prompt_data is None:
        raise ValueError("--num-epoch counts the prompts of --prompt-data: give it, or --num-rollout")
    unrendered = dataclasses.replace(setup.data, apply_chat_template=False)  # counting needs no tokenizer
    n_prompts = len(read_prompts(setup.data.prompt_data, unrendered))
    return max(1, setup.run.num_epoch or 0) * n_prompts // setup.rollout.rollout_batch_size


def plugin_title(rollout_path: str) -> str:
    """The --help group of the flags a rollout function's module declares."""
    return f"{rollout_path.replace(':', '.').rpartition('.')[0]} (rollout function options)"


def _check_no_clash(plugin_type: type[Any], rollout_path: str) -> None:
    core = {f.name for cls in CONFIGS.values() for f in dataclasses.fields(cls)}
    if clash := core & {f.name for f in dataclasses.fields(plugin_type)}:
        raise ValueError(f"the config of {rollout_path} redefines slimeish train options: {', '.join(sorted(clash))}")


def check_plugins(setup: TrainSetup) -> None:
    """Import every configured hook and check its signature (errors state the expected one), then
    run the rollout function's own check of its config."""
    cfg = setup.rollout
    load_rollout_function(cfg.rollout_function_path)
    if cfg.custom_generate_function_path:
        load_generate_function(cfg.custom_generate_function_path)
    if cfg.custom_rm_path:
        load_reward_function(cfg.custom_rm_path)
    if cfg.custom_reward_post_process_path:
        load_post_process(cfg.custom_reward_post_process_path)
    load_sample_hooks(cfg.rollout_sample_hook_path)
    if setup.slime.rm_type and cfg.custom_rm_path == ASYNC_RM_PATH:
        check_rm_type(setup.slime.rm_type, setup.slime.rm_url)
    if cfg.dynamic_sampling_filter_path:
        if setup.buffer.group_filter_path:
            raise ValueError("--dynamic-sampling-filter-path and --group-filter-path both filter groups: give one")
        probe_args = argparse.Namespace(**setup.values())  # the router's address is not known yet
        DynamicFilter(cfg.dynamic_sampling_filter_path, probe_args).check(cfg.n_samples_per_prompt)
    if setup.plugin is not None:
        check_rollout_config(setup.plugin)
    SlimeHooks.load(setup.slime_hooks)
    if setup.slime_hooks.data_source_path:
        load_data_source_class(setup.slime_hooks.data_source_path)
    check_trainer_hooks(setup)
    check_model_args(setup.slime.model_arg or [], setup.trainer.model_path)


def check_trainer_hooks(setup: TrainSetup) -> None:
    """slime's trainer-side hooks, checked here too: the trainer (maybe a rank actor) loads them
    again, later. torch is imported only when a hook that needs it is given."""
    t, loss = setup.trainer, setup.loss
    MegatronHooks.load(
        t.custom_megatron_init_path,
        t.custom_megatron_before_log_prob_hook_path,
        t.custom_megatron_before_train_step_hook_path,
    )
    if loss.custom_advantage_function_path or loss.rollout_data_postprocess_path:
        from slimeish.trainer import rollout_data

        if loss.custom_advantage_function_path:
            rollout_data.load_advantage_function(loss.custom_advantage_function_path)
        if loss.rollout_data_postprocess_path:
            rollout_data.load_postprocess(loss.rollout_data_postprocess_path)
    if loss.custom_loss_function_path or loss.custom_tis_function_path or loss.custom_pg_loss_reducer_function_path:
        from slimeish.trainer.loss_hooks import LossHooks

        LossHooks.load(loss)
    if setup.run.custom_update_weight_post_write_path:
        if setup.run.weight_sync != "disk":
            raise ValueError(
                "--custom-update-weight-post-write-path runs after a disk sync's files: --weight-sync disk"
            )
        from slimeish.trainer.weight_sync import POST_WRITE_SIGNATURE

        load_function(setup.run.custom_update_weight_post_write_path, expected=POST_WRITE_SIGNATURE,
                      params=["args", "version_dir", "rollout_engines"])  # fmt: skip


# slime `args` attributes plugins read that have one value here: their flags are refused
# (slime_flags.REFUSED); the ones that may vary are `SlimeConfig`'s flags.
SLIME_ARGS: dict[str, Any] = {
    "partial_rollout": False,  # no partial rollout: an aborted episode is failed, the group policy decides
    "mask_offpolicy_in_partial_rollout": False,
    "rollout_global_dataset": True,
    "group_rm": False,
    "ci_test": False,
}


def plugin_args(
    setup: TrainSetup,
    router_url: str,
    admin_token: str,
    *,
    router_urls: Sequence[str] = (),
    rollout_run: RolloutRun | None = None,
) -> argparse.Namespace:
    """The `args` rollout plugins receive: every option under slime's names (the rollout
    function's own included), plus where the routers are (`router_url` is the first of
    `router_urls`) and what the run's rollout calls share (`rollout_run`, a new one if not
    given). A copy per run: plugins may read it freely; changes do not reach the configs."""
    host, _, port = router_url.removeprefix("http://").partition(":")
    where = {
        "hf_checkpoint": str(setup.trainer.model_path),
        "router_url": router_url,
        "router_urls": list(router_urls) or [router_url],  # sessions are spread across them
        "admin_token": admin_token,  # the running router's (--admin-token may be unset)
        "sglang_router_ip": host,
        "sglang_router_port": int(port),
        RUN_ARG: rollout_run or RolloutRun(),
    }
    # Last, as slime's: the custom config's keys are the plugins' own options, over anything else.
    custom = custom_config(setup.slime_hooks)
    return argparse.Namespace(**SLIME_ARGS | _slime_names(setup) | setup.values() | where | custom)


def _slime_names(setup: TrainSetup) -> dict[str, Any]:
    """slime's (Megatron's) names for values slimeish has under its own, which plugins read (e.g. a
    tool loop's context budget, `context_parallel_size * max_tokens_per_gpu`)."""
    engines = len(setup.stack.engine_url) or setup.stack.num_engines
    return {
        "max_tokens_per_gpu": setup.trainer.micro_batch_tokens,
        "context_parallel_size": 1,
        "tensor_model_parallel_size": setup.trainer.tensor_parallel,
        "rollout_shuffle": setup.data.shuffle,
        "rollout_seed": setup.data.shuffle_seed,
        # slime bounds requests per engine; its plugins multiply by the engines, which gives --rollout-concurrency.
        "rollout_num_engines": engines,
        "sglang_server_concurrency": -(-setup.rollout.rollout_concurrency // engines),
    }


def command_line(setup: TrainSetup) -> list[str]:
    """The `slimeish train` flags that rebuild `setup`: every option that differs from its default,
    so a program that builds a setup can print the command it runs."""
    argv = ["--rollout-function-path", setup.rollout.rollout_function_path]
    for cfg in setup.configs().values():
        for f in dataclasses.fields(cfg):
            value = getattr(cfg, f.name)
            if f.name == "rollout_function_path" or value == _default(f):
                continue
            argv += _flag_args(f.name, value)
    return argv


def jsonable(setup: TrainSetup) -> dict[str, Any]:
    """The setup as `config.json` records it."""
    return {
        name: {k: str(v) if isinstance(v, Path) else v for k, v in fields_of(cfg).items()}
        for name, cfg in setup.configs().items()
    }


def fields_of(cfg: Any) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _flag_args(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + name.replace("_", "-")]
    if isinstance(value, list):
        return [flag, *map(str, value)] if value else []
    if isinstance(value, dict):  # a JSON-object flag (`--env-args`), read back with json.loads
        return [flag, json.dumps(value)]
    return [flag, str(value)]
