"""Typed configs of the trainer: model/optimisation (`TrainerConfig`) and the RL loss (`LossConfig`).

Each maps onto CLI flags with `slimeish.common.config.add_dataclass_args`; they are separate dataclasses
so each becomes its own flag group.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from slimeish.common.config import help_field

# The default name a LoRA run's adapter is served under on the engines (requests give it as
# `lora_path`); runs sharing engines each take their own (--lora-name).
LORA_ADAPTER_NAME = "policy"
# The Hugging Face modules each Megatron linear layer a LoRA adapter can wrap stands for (PEFT's
# target_modules; slimeish.trainer.lora says how each is split). `linear_fc1`/`linear_fc2` are the
# dense MLPs, and an MoE layer's shared experts.
LORA_HF_MODULES = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}
# An MoE layer's routed experts' linear layers, and the fused HF parameter each stands for (PEFT's
# target_parameters: transformers holds a layer's experts as 3-D parameters, slimeish.common.peft_experts).
LORA_HF_EXPERT_PARAMS = {
    "experts.linear_fc1": "mlp.experts.gate_up_proj",
    "experts.linear_fc2": "mlp.experts.down_proj",
}
LORA_TARGETS = (*LORA_HF_MODULES, *LORA_HF_EXPERT_PARAMS)


@dataclass(frozen=True)
class LoraSpec:
    """The adapters a LoRA run trains: `scale * B A x` added to each target's output."""

    rank: int
    alpha: float
    dropout: float
    targets: tuple[str, ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def hf_target_modules(self) -> list[str]:
        return [m for t in self.targets if t in LORA_HF_MODULES for m in LORA_HF_MODULES[t]]

    def hf_target_parameters(self) -> list[str]:
        return [LORA_HF_EXPERT_PARAMS[t] for t in self.targets if t in LORA_HF_EXPERT_PARAMS]

    def for_model(self, moe: bool) -> LoraSpec:
        """The targets a model has: a dense model has no routed experts."""
        return self if moe else replace(self, targets=tuple(t for t in self.targets if t in LORA_HF_MODULES))


@dataclass(kw_only=True)
class LossConfig:
    loss_type: Literal["policy_loss", "sft_loss", "custom_loss"] = help_field(
        "policy_loss",
        help="slime's loss types. policy_loss: the policy-gradient loss of --policy-loss; sft_loss: the negative "
        "log-likelihood of the loss-mask tokens (SFT: no advantages, no rollout log-probs used); custom_loss: "
        "--custom-loss-function-path's",
    )
    advantage_estimator: Literal["grpo", "dr_grpo"] = help_field(
        "grpo", help="grpo: (r - group mean) / group std; dr_grpo: r - group mean (no std division)"
    )
    policy_loss: Literal["ppo", "gspo", "cispo"] = help_field(
        "ppo", help="ppo: token-level clipped ratio; gspo: sequence-level ratio; cispo: clipped stop-grad IS weight"
    )
    eps_clip: float = help_field(0.2, help="lower clip range: ratio >= 1 - eps_clip")
    eps_clip_high: float | None = help_field(
        None, help="upper clip range, 1 + eps_clip_high (DAPO clip-higher; default eps_clip)"
    )
    dual_clip_c: float | None = help_field(None, help="dual-clip bound c > 1 for negative advantages (off when unset)")
    loss_aggregation: Literal["token", "sequence"] = help_field(
        "token", help="token: mean over all trained tokens of the batch; sequence: mean of per-sequence means"
    )
    old_log_probs: Literal["trainer", "rollout"] = help_field(
        "trainer",
        help="pi_old in the ratio: the trainer's log-probs before the step, or the engine's rollout_log_probs",
    )
    kl_coef: float = help_field(0.0, help="weight of the KL penalty to the frozen reference model (0: no reference)")
    kl_estimator: Literal["k1", "k2", "k3"] = help_field("k3", help="per-token KL estimator (k3 = low-variance)")
    entropy_coef: float = help_field(0.0, help="weight of the entropy bonus")
    tis: bool = help_field(
        False, help="importance-sampling correction between trainer and rollout log-probs (TIS, or MIS by --tis-mode)"
    )
    tis_mode: Literal["truncate", "mask"] = help_field(
        "truncate",
        help="truncate (TIS): weight clamp(rho, low, high); mask (MIS): weight rho inside [low, high], 0 outside",
    )
    tis_level: Literal["token", "sequence"] = help_field(
        "token", help="token: rho per token; sequence: rho = product over the sample's trained tokens, one weight"
    )
    tis_clip_low: float = help_field(0.0, help="lower bound of the TIS/MIS ratio")
    tis_clip_high: float = help_field(2.0, help="upper bound of the TIS/MIS ratio")
    icepop: bool = help_field(
        False,
        help="IcePop: per token, weight rho inside [--icepop-low, --icepop-high] and mask the token outside "
        "(token-level MIS with IcePop's band); instead of --tis",
    )
    icepop_low: float = help_field(0.5, help="IcePop's lower ratio bound (alpha)")
    icepop_high: float = help_field(5.0, help="IcePop's upper ratio bound (beta)")
    use_opd: bool = help_field(
        False,
        help="on-policy distillation (slime's OPD): each token's advantage is lowered by --opd-kl-coef x "
        "(pi_old - teacher log-prob), the teacher's from Sample.teacher_log_probs (set by a reward post-process)",
    )
    opd_type: Literal["sglang", "megatron"] | None = help_field(
        None,
        help="slime's OPD teacher: sglang (a teacher server scores the samples in the reward, e.g. a second "
        "`slimeish engine` at --rm-url); megatron (a teacher in the trainer) is not supported",
    )
    opd_kl_coef: float = help_field(1.0, help="weight of the OPD reverse KL in the advantages")
    compute_advantages: bool = help_field(
        True,
        help="off: slime's --disable-compute-advantages-and-returns, for a loss that uses no advantages "
        "(--loss-type sft_loss)",
    )
    custom_advantage_function_path: str | None = help_field(
        None,
        help="slime's advantage hook, called in place of --advantage-estimator on each train step's samples: "
        "def custom_fn(args, rollout_data) -> None, setting rollout_data['advantages'] (one tensor per sample over "
        "its response tokens; slimeish.trainer.rollout_data) (default: None)",
    )
    rollout_data_postprocess_path: str | None = help_field(
        None,
        help="slime's hook on each train step's batch once its advantages are computed: def postprocess(args, "
        "rollout_id, rollout_data) -> None; the loss_masks and advantages it leaves are trained on "
        "(slimeish.trainer.rollout_data) (default: None)",
    )

    custom_loss_function_path: str | None = help_field(
        None,
        help="slime's loss with --loss-type custom_loss, per micro-batch: def loss(args, batch, logits, "
        "sum_of_sample_mean) -> (loss, metrics); logits [1, T, V] of the packed sequences (slimeish.trainer."
        "loss_hooks) (default: None)",
    )
    custom_tis_function_path: str | None = help_field(
        None,
        help="slime's off-policy correction in place of --tis-mode's, with --tis: def tis(args, *, pg_loss, "
        "train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths, **kwargs) -> "
        "(pg_loss, loss_masks, metrics) (default: None)",
    )
    custom_pg_loss_reducer_function_path: str | None = help_field(
        None,
        help="slime's reduction of the policy-gradient loss in place of --loss-aggregation's: def reducer("
        "total_lengths, response_lengths, loss_masks, calculate_per_token_loss) -> Callable[[Tensor], Tensor] "
        "(default: None)",
    )

    def __post_init__(self) -> None:
        if self.eps_clip < 0 or (self.eps_clip_high is not None and self.eps_clip_high < 0):
            raise ValueError("eps_clip and eps_clip_high must be >= 0")
        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            raise ValueError(f"dual_clip_c must be > 1, got {self.dual_clip_c}")
        if self.loss_type == "sft_loss" and (self.tis or self.icepop):
            raise ValueError("--loss-type sft_loss trains on no rollout log-probs; drop --tis / --icepop")
        self._check_opd()
        self._check_loss_hooks()
        if not self.compute_advantages and self.loss_type == "policy_loss":
            raise ValueError(
                "--no-compute-advantages (slime's --disable-compute-advantages-and-returns): the policy loss trains "
                "on advantages; only --loss-type sft_loss or custom_loss may use none"
            )
        if self.tis and self.icepop:
            raise ValueError("--tis and --icepop are two corrections of the same mismatch; choose one")
        if (self.tis or self.icepop) and self.old_log_probs == "rollout":
            raise ValueError("tis/icepop correct trainer-vs-rollout mismatch; they need old_log_probs='trainer'")
        if not 0 <= self.tis_clip_low <= self.tis_clip_high or self.tis_clip_high <= 0:
            raise ValueError("need 0 <= tis_clip_low <= tis_clip_high and tis_clip_high > 0")
        if not 0 < self.icepop_low <= self.icepop_high:
            raise ValueError("need 0 < icepop_low <= icepop_high")

    def correction(self) -> tuple[str, str, float, float] | None:
        """The selected off-policy correction as (mode, level, low, high), or None."""
        if self.icepop:
            return "mask", "token", self.icepop_low, self.icepop_high
        if self.tis:
            return self.tis_mode, self.tis_level, self.tis_clip_low, self.tis_clip_high
        return None

    def _check_loss_hooks(self) -> None:
        """slime calls each loss hook in one place only: a hook given where it would never run is refused."""
        if (self.loss_type == "custom_loss") != bool(self.custom_loss_function_path):
            raise ValueError("--loss-type custom_loss and --custom-loss-function-path go together: give both")
        policy = self.loss_type == "policy_loss"
        if self.custom_tis_function_path and not (policy and self.tis):
            raise ValueError(
                "--custom-tis-function-path is slime's correction of the policy loss under --use-tis: give --tis "
                "(and --loss-type policy_loss)"
            )
        if self.custom_pg_loss_reducer_function_path and not policy:
            raise ValueError("--custom-pg-loss-reducer-function-path reduces the policy loss: --loss-type policy_loss")

    def _check_opd(self) -> None:
        if not self.use_opd:
            return
        if self.opd_type is None:
            raise ValueError("--use-opd needs --opd-type sglang (the teacher's log-probs come from the reward)")
        if self.opd_type == "megatron":
            raise ValueError(
                "--opd-type megatron (a teacher model inside the trainer) is not supported: serve the teacher with "
                "`slimeish engine --model TEACHER`, give its /generate as --rm-url, and use --opd-type sglang "
                "with slime's OPD reward function and post-process"
            )
        if self.loss_type == "sft_loss":
            raise ValueError("--use-opd adds to the policy-gradient advantages; --loss-type sft_loss has none")


@dataclass(kw_only=True)
class TrainerConfig:
    model_path: Path = help_field(help="Hugging Face model directory (config.json, safetensors, tokenizer)")
    device: Literal["auto", "cpu", "cuda"] = help_field(
        "auto", help="cpu: gloo + torch AdamW; cuda: NCCL + Megatron optimizer"
    )
    dtype: Literal["float32", "bfloat16"] = help_field("float32", help="parameter dtype (bfloat16 on GPU only)")
    tensor_parallel: int = help_field(1, help="Megatron tensor-parallel size (GPU)")
    expert_model_parallel_size: int = help_field(
        1,
        help="slime's expert parallel: MoE models only; each of this many ranks holds num_experts / N routed "
        "experts (N must divide them) and the ranks' tokens are dispatched to them (CPU: gloo ranks)",
    )
    lr: float = help_field(1e-6, help="peak learning rate")
    min_lr: float = help_field(0.0, help="learning rate at the end of the decay")
    lr_warmup_steps: int = help_field(0, help="linear warm-up steps from 0 to --lr")
    lr_warmup_fraction: float | None = help_field(
        None,
        help="slime's (Megatron's) warm-up as a fraction of the run's optimizer steps; `slimeish train` sets "
        "--lr-warmup-steps from it (default: None)",
    )
    lr_decay_steps: int | None = help_field(
        None,
        help="steps of decay after warm-up (unset: `slimeish train` decays over the rest of the run, as Megatron "
        "over its train iterations)",
    )
    lr_decay_style: Literal["constant", "linear", "cosine"] = help_field("constant", help="decay shape after warm-up")
    weight_decay: float = help_field(0.0, help="AdamW weight decay")
    adam_beta1: float = help_field(0.9, help="AdamW beta1")
    adam_beta2: float = help_field(0.98, help="AdamW beta2")
    adam_eps: float = help_field(1e-8, help="AdamW epsilon")
    clip_grad: float = help_field(1.0, help="max global gradient norm (0: no clipping)")
    micro_batch_tokens: int = help_field(4096, help="max tokens per micro-batch (padding included)")
    use_rollout_routing_replay: bool = help_field(
        False,
        help="MoE routing replay (R3, slime's flag): every forward routes each token to the experts the engine "
        "routed it to (Sample.rollout_routed_experts, which the router records), with the trainer's own scores",
    )
    global_batch_size: int | None = help_field(
        None, help="samples per optimizer step; a train_step batch must be a multiple (unset: one step per call)"
    )
    seed: int = help_field(0, help="random seed")
    lora_rank: int = help_field(
        0, help="LoRA rank: train low-rank adapters on a frozen base model (0: full fine-tuning)"
    )
    lora_name: str = help_field(
        LORA_ADAPTER_NAME,
        help="LoRA runs: the name the adapter is loaded under on the engines (the weight sync's lora_name, the "
        "routers' --lora-path); runs sharing engines (--engine-url) each need their own",
    )
    lora_alpha: float = help_field(16.0, help="LoRA alpha: adapters add (alpha / rank) * B A x")
    lora_dropout: float = help_field(0.0, help="dropout on the adapters' input while training")
    lora_target_modules: list[str] = help_field(
        list(LORA_TARGETS),
        help="Megatron layers that get adapters: linear_qkv (attention q/k/v), linear_proj (attention output), "
        "linear_fc1 (MLP gate/up: dense layers' and MoE shared experts'), linear_fc2 (their down), "
        "experts.linear_fc1 (each routed expert's gate/up), experts.linear_fc2 (its down); a dense model has no "
        "experts.* layers",
    )
    custom_megatron_init_path: str | None = help_field(
        None, help="slime's hook run once the process group is up, before the model is built: def init(args) -> None"
    )
    custom_megatron_before_log_prob_hook_path: str | None = help_field(
        None,
        help="slime's hook run before each forward-only log-prob pass: def hook(args, model, store_prefix) -> None",
    )
    custom_megatron_before_train_step_hook_path: str | None = help_field(
        None,
        help="slime's hook run before each optimizer step, gradients zeroed: def hook(args, rollout_id, step_id, "
        "model, optimizer, opt_param_scheduler) -> None (opt_param_scheduler: None here)",
    )

    def __post_init__(self) -> None:
        self.model_path = Path(self.model_path)
        if self.expert_model_parallel_size < 1:
            raise ValueError("expert_model_parallel_size must be >= 1")
        if self.micro_batch_tokens <= 0:
            raise ValueError("micro_batch_tokens must be > 0")
        if self.global_batch_size is not None and self.global_batch_size <= 0:
            raise ValueError("global_batch_size must be > 0")
        if self.lr_warmup_fraction is not None and not 0 <= self.lr_warmup_fraction <= 1:
            raise ValueError("lr_warmup_fraction must be in [0, 1]")
        self._check_lora()

    def _check_lora(self) -> None:
        if self.lora_rank < 0:
            raise ValueError("lora_rank must be >= 0 (0: no LoRA)")
        if not self.lora_name:
            raise ValueError("lora_name must be a non-empty adapter name")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError("lora_dropout must be in [0, 1)")
        unknown = sorted(set(self.lora_target_modules) - set(LORA_TARGETS))
        if unknown or not self.lora_target_modules:
            raise ValueError(f"lora_target_modules: unknown {unknown}; choose from {list(LORA_TARGETS)}")

    def lora(self) -> LoraSpec | None:
        """The adapters to train, or None without LoRA."""
        if not self.lora_rank:
            return None
        return LoraSpec(self.lora_rank, self.lora_alpha, self.lora_dropout, tuple(self.lora_target_modules))

    def use_gpu(self) -> bool:
        import torch

        if self.device == "auto":
            return torch.cuda.is_available()
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but CUDA is not available")
        return self.device == "cuda"
