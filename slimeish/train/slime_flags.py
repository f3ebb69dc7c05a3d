"""slime's launch-script flags on `slimeish train`'s command line.

Every flag of slime's own argument parser (and the Megatron/SGLang flags its launch scripts
commonly pass) is either a `slimeish train` flag of the same name and meaning, renamed here to
slimeish's flag, carried onto `args` (`SlimeConfig`), accepted with a note printed at start-up
(it changes nothing here: Megatron tuning, or what slimeish always does), or refused at start-up
with what to use instead. None is dropped silently; docs/coming_from_slime.md has the table.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from slimeish.common.config import help_field
from slimeish.train.model_args import BOOLEAN, FLAGS, as_arg


@dataclass(kw_only=True)
class SlimeConfig:
    """slime's `args` attributes that plugins read, with slime's names and defaults."""

    model_name: str | None = help_field(None, help="slime's --model-name, on args for plugins (default: None)")
    rollout_max_context_len: int | None = help_field(
        None, help="slime's engine context length, on args for plugins that budget a conversation (default: None)"
    )
    rollout_skip_special_tokens: bool = help_field(
        False, help="GenerateState's sampling_params skip special tokens when detokenizing (default: False)"
    )
    rollout_stop_token_ids: list[int] | None = help_field(
        None, help="stop token ids in GenerateState's sampling_params (default: None)"
    )
    over_sampling_batch_size: int | None = help_field(
        None,
        help="on args only: slimeish replaces each filtered group by generating one more, so no over-sampling "
        "batch is needed (default: None)",
    )
    rm_type: str | None = help_field(
        None,
        help="slime's built-in reward when no --custom-rm-path is given: math, dapo, deepscaler, f1, remote_rm "
        "(--rm-url), random, or boxed_<type> (slimeish.rollout.rm_hub) (default: None)",
    )
    rm_url: str | None = help_field(None, help="a remote reward model's URL, on args for plugins (default: None)")
    model_arg: list[str] | None = help_field(
        None,
        help="slime's MODEL_ARGS (--num-layers, --hidden-size, --qk-layernorm, ...) as name=value: each is checked "
        "against --hf-checkpoint's config.json at start-up, which the model is built from (default: None)",
    )
    loss_mask_type: Literal["qwen", "qwen3", "qwen3_5", "distill_qwen"] = help_field(
        "qwen", help="slimeish.utils.mask_utils.MultiTurnLossMaskGenerator's template (default: qwen)"
    )


class SlimeFlagError(ValueError):
    """A slime flag with no meaning here; the message says what to use instead."""


# A flag slimeish takes under another name: the values it takes (0, 1 or "+") and what it becomes.
Rewrite = Callable[[list[str]], list[str]]


@dataclass(frozen=True)
class Rule:
    nargs: int | Literal["+"]
    to: str | Rewrite  # slimeish's flag (the values follow it), or a rewrite of the values
    note: str = ""  # printed at start-up: why a flag that changes nothing here is accepted


def _renamed(flag: str) -> Rule:
    return Rule(1, flag)


def _to(nargs: int | Literal["+"], rewrite: Rewrite) -> Rule:
    return Rule(nargs, rewrite)


def _noop(nargs: int, note: str) -> Rule:
    """A flag whose effect slimeish always has, or that tunes only Megatron's speed or memory."""
    return Rule(nargs, lambda _: [], note)


def _only(value: str, note: str, refusal: str) -> Rule:
    """A flag accepted at the value that means what slimeish does, refused at any other."""

    def check(values: list[str]) -> list[str]:
        if [v.rstrip("0").rstrip(".") or "0" for v in values] != [value]:
            raise SlimeFlagError(f"{' '.join(values)}: {refusal}")
        return []

    return Rule(1, check, note)


PLACEMENT = (
    "slimeish places its parts itself: engines with --num-engines/--engine-device (or --engine-url for SGLang "
    "servers you start), the trainer with --device and --tensor-parallel"
)
WEIGHTS = "weights go to the engines after every step by --weight-sync tensor|disk|distributed"
LOGGING = "metrics go to <run-dir>/metrics.jsonl, shown by `slimeish viewer` (--viewer-port)"
MEGATRON = "the trainer is configured by --micro-batch-tokens, --dtype, --tensor-parallel and the optimizer flags"
ARCH = "the architecture is read from --hf-checkpoint's config.json (MODEL_ARGS are checked against it)"
ENGINE = "embedded engines take no SGLang options: start SGLang yourself with them and pass --engine-url"
DEBUG = "no debug dumps: `slimeish buffer export` writes the trained samples"
NO_CRITIC = "no critic or PPO value model: --advantage-estimator grpo|dr_grpo"
EVAL = "evaluation runs the rollout function with evaluation=True on --eval-prompt-data, with --eval-temperature"
TUNING = "Megatron speed/memory tuning, no effect on what is trained here"
CKPT = "checkpoints are <run-dir>/checkpoints (--save-interval); --load resumes from one"


def _eval_prompt_data(values: list[str]) -> list[str]:
    if len(values) == 1:
        return ["--eval-prompt-data", values[0]]
    if len(values) == 2:  # slime's `name path`
        return ["--eval-prompt-data", values[1]]
    raise SlimeFlagError("--eval-prompt-data takes one dataset here (`name path` or `path`)")


def _advantage_estimator(values: list[str]) -> list[str]:
    (name,) = values
    if name in ("gspo", "cispo"):
        return ["--advantage-estimator", "grpo", "--policy-loss", name]
    if name in ("grpo", "dr_grpo"):  # dr_grpo: slimeish's own
        return ["--advantage-estimator", name]
    raise SlimeFlagError(
        f"--advantage-estimator {name}: slimeish has grpo and dr_grpo (--policy-loss ppo|gspo|cispo); " + NO_CRITIC
    )


def _kl_loss_type(values: list[str]) -> list[str]:
    (name,) = values
    return ["--kl-estimator", "k3" if name == "low_var_kl" else name]


def _engine_addrs(values: list[str]) -> list[str]:
    return ["--engine-url", *(v if "://" in v else f"http://{v}" for v in values)]


RULES: dict[str, Rule] = {
    # renamed to slimeish's flag
    "--hf-checkpoint": _renamed("--model-path"),
    "--rollout-shuffle": _to(0, lambda _: ["--shuffle"]),
    "--rollout-seed": _renamed("--shuffle-seed"),
    "--tensor-model-parallel-size": _renamed("--tensor-parallel"),
    "--lr-warmup-iters": _renamed("--lr-warmup-steps"),
    "--lr-decay-iters": _renamed("--lr-decay-steps"),
    "--max-tokens-per-gpu": _renamed("--micro-batch-tokens"),
    "--bf16": _to(0, lambda _: ["--dtype", "bfloat16"]),
    "--eps-clip-c": _renamed("--dual-clip-c"),
    "--use-tis": _to(0, lambda _: ["--tis"]),
    "--tis-clip": _renamed("--tis-clip-high"),
    "--use-rollout-logprobs": _to(0, lambda _: ["--old-log-probs", "rollout"]),
    "--calculate-per-token-loss": _to(0, lambda _: ["--loss-aggregation", "token"]),
    "--kl-loss-coef": _renamed("--kl-coef"),
    "--kl-loss-type": _to(1, _kl_loss_type),
    "--advantage-estimator": _to(1, _advantage_estimator),
    "--disable-grpo-std-normalization": _to(0, lambda _: ["--advantage-estimator", "dr_grpo"]),
    "--eval-prompt-data": _to("+", _eval_prompt_data),
    "--disable-compute-advantages-and-returns": _to(0, lambda _: ["--no-compute-advantages"]),
    "--rollout-external-engine-addrs": _to("+", _engine_addrs),
    # slime's MODEL_ARGS: checked against the checkpoint's config.json at start-up (model_args)
    **{flag: _to(0 if flag[2:].replace("-", "_") in BOOLEAN else 1, functools.partial(as_arg, flag)) for flag in FLAGS},
    # accepted with a note: what slimeish always does, or Megatron speed/memory tuning
    "--debug-train-only": _noop(
        0,
        "engines start anyway: slime's train-only run (its SFT rollout) generates nothing and leaves them idle; "
        "its debug rollout data (--load-debug-rollout-data) is refused",
    ),
    **dict.fromkeys(
        ["--actor-num-nodes", "--actor-num-gpus-per-node"],
        _noop(
            1,
            "the trainer runs on --device, as data-parallel ranks with --trainer-world-size (--launcher ray); the "
            "loss is normalised over the global batch, so the update is the same on any number of ranks",
        ),
    ),
    "--use-kl-loss": _noop(0, "the KL loss is on when --kl-loss-coef (--kl-coef) > 0"),
    "--use-dynamic-batch-size": _noop(0, "micro-batches are always packed by --micro-batch-tokens"),
    "--get-mismatch-metrics": _noop(0, "train/rollout_kl and the IS-weight metrics are always logged"),
    "--disable-rewards-normalization": _noop(0, "rewards are not normalised before the group advantages"),
    "--optimizer": _only("adam", "the optimizer is AdamW", "the optimizer is AdamW (--optimizer adam)"),
    "--ref-load": _noop(1, "the KL reference is the initial --hf-checkpoint (slime's --ref-load is that model)"),
    "--pipeline-model-parallel-size": _only("1", "no pipeline parallelism", PLACEMENT),
    "--context-parallel-size": _only("1", "no context parallelism", PLACEMENT),
    "--expert-tensor-parallel-size": _only("1", "experts are not split by tensor parallelism", PLACEMENT),
    "--attention-dropout": _only("0", "no dropout", "slimeish trains without dropout"),
    "--hidden-dropout": _only("0", "no dropout", "slimeish trains without dropout"),
    **dict.fromkeys(
        [
            "--sequence-parallel",
            "--accumulate-allreduce-grads-in-fp32",
            "--attention-softmax-in-fp32",
            "--balance-data",
            "--balance-by-flops",
            "--no-gradient-accumulation-fusion",
            "--use-distributed-optimizer",
            "--optimizer-cpu-offload",
            "--overlap-cpu-optimizer-d2h-h2d",
            "--offload",
            "--offload-train",
            "--offload-rollout",
            "--no-offload-train",
            "--no-offload-rollout",
            "--recompute-loss-function",
        ],
        _noop(0, TUNING),
    ),
    **dict.fromkeys(
        [
            "--attention-backend",
            "--recompute-granularity",
            "--recompute-method",
            "--recompute-num-layers",
            "--log-probs-chunk-size",
        ],
        _noop(1, TUNING),
    ),
}

# A flag with no meaning here -> what to use instead.
REFUSED: dict[str, str] = {
    "--partial-rollout": (
        "no partial rollout: an aborted episode fails and --failed-policy decides; --mode async overlaps "
        "generation and training"
    ),
    "--mask-offpolicy-in-partial-rollout": ("no partial rollout"),
    "--rollout-max-prompt-len": ("prompts are not filtered by length: filter the --prompt-data JSONL"),
    "--buffer-filter-path": (
        "no partial rollout, so no buffer of half-generated groups to pick from: groups given back are served again "
        "first, in order; filter groups with --dynamic-sampling-filter-path or --group-filter-path"
    ),
    "--custom-model-provider-path": (
        "the model is built from --hf-checkpoint's config.json, and its weights are loaded and synced to the engines "
        "by Hugging Face name: a provider's own GPTModel has no such mapping"
    ),
    "--megatron-config-path": "its role-tagged Megatron configs are for a critic: " + NO_CRITIC,
    "--rollout-all-samples-process-path": (
        "groups a dynamic filter drops stay in the buffer, never handed back to a rollout step: see the trained "
        "ones with --rollout-sample-filter-path or --custom-rollout-log-function-path"
    ),
    "--rollout-data-transport": ("rollout data goes through the Redis buffer (--buffer-url)"),
    "--disable-rollout-global-dataset": ("prompts always come from --prompt-data"),
    "--multimodal-keys": ("text-only: no multimodal processor here"),
    "--start-rollout-id": ("--load resumes at the step after the saved one"),
    "--num-steps-per-rollout": (
        "give --global-batch-size (rollout_batch_size x n_samples_per_prompt / steps per rollout)"
    ),
    "--micro-batch-size": ("micro-batches are packed by --micro-batch-tokens"),
    "--log-probs-max-tokens-per-gpu": ("--micro-batch-tokens bounds log-prob passes too"),
    "--group-rm": ("rewards are per sample; score a whole group in --custom-reward-post-process-path"),
    "--eval-reward-key": ("--reward-key applies to evaluation too"),
    "--custom-convert-samples-to-train-data-path": (
        "the trainer trains the Samples read from the buffer, not slime's dict of lists: edit what is trained with "
        "--rollout-data-postprocess-path (loss masks, advantages) or --custom-reward-post-process-path (rewards)"
    ),
    "--ref-ckpt-step": ("the KL reference is the initial --hf-checkpoint"),
    "--ref-update-interval": ("the KL reference stays the initial --hf-checkpoint"),
    "--async-save": (CKPT),
    "--no-save-optim": (CKPT),
    "--save-hf": (CKPT + " (HF format, loadable by --hf-checkpoint)"),
    "--fp16": ("--dtype float32|bfloat16"),
}


def _refuse_all(flags: Sequence[str], why: str) -> None:
    REFUSED.update(dict.fromkeys(flags, why))


_refuse_all(
    [
        "--rollout-num-gpus",
        "--rollout-num-gpus-per-engine",
        "--num-gpus-per-node",
        "--distributed-backend",
        "--distributed-timeout-minutes",
        "--decoder-last-pipeline-num-layers",
    ],
    PLACEMENT,
)
_refuse_all(
    [
        "--colocate",
    ],
    PLACEMENT,
)
_refuse_all(
    [
        "--update-weight-mode",
        "--update-weight-transport",
        "--update-weight-disk-dir",
        "--update-weight-delta-encoding",
        "--update-weight-delta-checksum",
        "--update-weight-local-checkpoint-dir",
        "--update-weight-buffer-size",
        "--update-weights-interval",
    ],
    WEIGHTS,
)
_refuse_all(["--release-train", "--update-weight-disk-keep-files", "--keep-old-actor"], WEIGHTS)
_refuse_all(
    [
        "--qwen-gdn-backend",
        "--train-env-vars",
        "--mtp-num-layers",
        "--mtp-loss-scaling-factor",
        "--padded-vocab-size",
        "--data-pad-size-multiplier",
    ],
    MEGATRON,
)
_refuse_all(
    [
        "--only-train-params-name-list",
        "--freeze-params-name-list",
        "--megatron-deepgemm-forward-layers",
        "--megatron-deepgemm-forward-modules",
        "--megatron-deepgemm-moe-forward-layers",
        "--megatron-deepgemm-moe-forward-modules",
    ],
    MEGATRON,
)
_refuse_all(
    [
        "--freeze-indexer",
        "--allgather-cp",
        "--enable-mtp-training",
        "--reset-optimizer-states",
        "--use-stateless-adam",
        "--use-routing-replay",  # record-then-replay between slime's own passes; R3 is the native flag below
        "--use-precision-aware-optimizer",
        "--use-opsm",
    ],
    MEGATRON,
)
_refuse_all(["--seq-length"], ARCH)
_refuse_all(["--num-critic-only-steps", "--value-clip", "--gamma", "--lambd"], NO_CRITIC)
_refuse_all(["--normalize-advantages", "--use-unbiased-kl", "--use-rollout-entropy"], NO_CRITIC)
_refuse_all(
    ["--opsm-delta"],
    "OPSM (--use-opsm) is not offered: mask off-policy negative samples with a --custom-tis-function-path, or "
    "use --tis --tis-mode mask / --icepop (docs/losses.md)",
)
_refuse_all(
    ["--opd-teacher-load", "--opd-teacher-ckpt-step"],
    "no teacher inside the trainer: --opd-type sglang, with the teacher served by `slimeish engine --model TEACHER` "
    "at --rm-url",
)
_refuse_all(
    [
        "--wandb-mode",
        "--wandb-dir",
        "--wandb-key",
        "--wandb-host",
        "--wandb-team",
        "--wandb-group",
        "--wandb-project",
        "--wandb-run-id",
        "--tb-project-name",
        "--tb-experiment-name",
        "--log-reward-category",
    ],
    LOGGING,
)
_refuse_all(
    [
        "--use-wandb",
        "--disable-wandb-random-suffix",
        "--wandb-always-use-train-step",
        "--log-multi-turn",
        "--log-passrate",
        "--log-correct-samples",
        "--use-tensorboard",
    ],
    LOGGING,
)
_refuse_all(
    [
        "--save-debug-rollout-data",
        "--load-forge-rollout-data",
        "--load-debug-rollout-data",
        "--load-debug-rollout-data-subsample",
        "--save-debug-train-data",
        "--dump-details",
        "--memory-snapshot-dir",
        "--memory-snapshot-num-steps",
        "--memory-recorder",
        "--ci-save-grad-norm",
        "--ci-load-grad-norm",
        "--ci-train-rollout-logprob-abs-diff-threshold",
    ],
    DEBUG,
)
_refuse_all(["--profile-target"], DEBUG)
_refuse_all(
    [
        "--record-memory-history",
        "--check-weight-update-equal",
        "--ci-test",
        "--ci-disable-kl-checker",
    ],
    DEBUG,
)
_refuse_all(["--use-fault-tolerance"], "the router health-checks its engines itself")
_refuse_all(
    ["--rollout-health-check-interval", "--rollout-health-check-timeout", "--rollout-health-check-first-wait"],
    "the router health-checks its engines itself",
)
_refuse_all(["--http-proxy"], "set HTTP_PROXY in the environment")
_refuse_all(["--use-distributed-post"], "plugins post through slimeish.utils.http_utils.post")
_refuse_all(
    ["--rollout-buffer-url", "--fetch-trajectory-retry-times", "--min-batch-collection-ratio", "--rollout-task-type"],
    "the rollout buffer is slimeish's Redis buffer (--buffer-url)",
)
_refuse_all(
    [
        "--eval-config",
        "--eval-input-key",
        "--eval-label-key",
        "--eval-tool-key",
        "--eval-max-prompt-len",
        "--eval-min-new-tokens",
        "--eval-max-context-len",
    ],
    EVAL,
)
_refuse_all(["--skip-eval-before-train"], EVAL + " (at the first and last step and every --eval-interval)")
_refuse_all(["--train-backend"], "the trainer is slimeish's Megatron trainer (--device cpu|cuda)")
_refuse_all(["--sglang-router-ip", "--sglang-router-port"], "slimeish starts its own router (--router-port)")


def _check_disjoint() -> None:
    if both := set(RULES) & set(REFUSED):
        raise AssertionError(f"slime flags both taken and refused: {sorted(both)}")


_check_disjoint()


def translate(argv: Sequence[str], notes: list[str] | None = None) -> list[str]:
    """slime's flags in `argv` rewritten to slimeish's; a refused one raises `SlimeFlagError` saying what to
    use instead, and an accepted one that changes nothing here adds its note to `notes`."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, inline = token.partition("=")
        if why := refusal(name) if token.startswith("--") else None:
            raise SlimeFlagError(f"{name} (slime) has no meaning here: {why}")
        rule = RULES.get(name) if token.startswith("--") else None
        if rule is None:
            out.append(token)
            i += 1
            continue
        values, i = _values(argv, i + 1, rule.nargs, inline if eq else None)
        try:
            out += [rule.to, *values] if isinstance(rule.to, str) else rule.to(values)
        except SlimeFlagError as exc:
            raise SlimeFlagError(f"{name} (slime) {exc}") from None
        if rule.note and notes is not None:
            notes.append(f"{name} (slime) accepted: {rule.note}")
    return out


def refusal(flag: str) -> str | None:
    """Why a slime flag is refused, or None when it is not."""
    return REFUSED.get(flag) or (ENGINE if flag.startswith("--sglang-") else None)


def _values(argv: Sequence[str], i: int, nargs: int | Literal["+"], inline: str | None) -> tuple[list[str], int]:
    if inline is not None:
        return [inline], i
    if nargs == "+":
        j = i
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        return list(argv[i:j]), j
    return list(argv[i : i + nargs]), i + nargs
