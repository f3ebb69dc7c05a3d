"""The Megatron trainer: one policy-gradient optimizer step per global batch of samples.

`Trainer` owns the policy (a Megatron GPTModel), an optional frozen reference model for the KL
penalty (a LoRA run's is its own policy with the adapters off: no second copy), the optimizer and
the counters that make a run resumable (step, weight version, data position). Everything it
trains on is a `Sample`; everything it hands to engines is HF-named.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from slimeish.common.sample import Sample
from slimeish.trainer import checkpoint, hf_io, lora
from slimeish.trainer import losses as L
from slimeish.trainer.advantages import (
    group_normalized_advantages,
    sample_group_ids,
    sample_member_ids,
    sample_rewards,
)
from slimeish.trainer.batching import (
    MicroBatch,
    idle_micro_batch,
    pack_micro_batches,
    split_global_batches,
    validate_samples,
)
from slimeish.trainer.config import LossConfig, TrainerConfig
from slimeish.trainer.convert import hf_to_megatron
from slimeish.trainer.distributed import (
    all_reduce_data_parallel,
    data_parallel_rank_and_size,
    global_rank,
    init_distributed,
    sum_over_data_parallel,
)
from slimeish.trainer.expert_parallel import align_micro_batch_count, expert_parallel_grad_norm
from slimeish.trainer.forward import response_log_probs
from slimeish.trainer.loss_hooks import (
    LossHooks,
    get_sum_of_sample_mean,
    packed_logits,
    packed_response_log_probs,
    rollout_batch,
    slime_loss_args,
)
from slimeish.trainer.megatron_hooks import MegatronHooks, trainer_args
from slimeish.trainer.model import build_gpt_model, gpt_logits, model_shape
from slimeish.trainer.moe_aux_loss import start_moe_step, stop_moe_aux_loss
from slimeish.trainer.optimizer import (
    build_cpu_optimizer,
    build_gpu_optimizer,
    lr_at,
    set_lr,
    wrap_gpu_model,
)
from slimeish.trainer.rollout_data import custom_advantages, load_advantage_function, load_postprocess, postprocess
from slimeish.trainer.routing_replay import ModelRouting


class Trainer:
    def __init__(self, config: TrainerConfig, loss: LossConfig | None = None, hook_args: dict[str, Any] | None = None):
        """`hook_args`: more of the `args` slime's hooks receive (slimeish train's --custom-config-path keys)."""
        from transformers import AutoConfig

        self.config, self.loss_config = config, loss or LossConfig()
        self.use_gpu = config.use_gpu()
        if config.dtype == "bfloat16" and not self.use_gpu:
            raise ValueError("dtype=bfloat16 needs device=cuda")
        init_distributed(
            use_gpu=self.use_gpu,
            tensor_parallel=config.tensor_parallel,
            expert_parallel=config.expert_model_parallel_size,
            seed=config.seed,
        )
        self.hooks = MegatronHooks.load(
            config.custom_megatron_init_path,
            config.custom_megatron_before_log_prob_hook_path,
            config.custom_megatron_before_train_step_hook_path,
        )
        # What slime's trainer-side hooks receive: the options, under slime's names too, and the custom config.
        self.args = trainer_args(config, self.loss_config)
        vars(self.args).update(slime_loss_args(self.loss_config) | (hook_args or {}))
        self.loss_hooks = LossHooks.load(self.loss_config)
        if self.hooks.init is not None:
            self.hooks.init(self.args)
        self.hf_config = AutoConfig.from_pretrained(config.model_path)
        self.shape = model_shape(self.hf_config, config.tensor_parallel)
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.use_gpu else torch.device("cpu")
        # Converted once: the policy and the KL reference start from the same weights.
        weights = hf_to_megatron(hf_io.read_hf_weights(config.model_path), self.shape)
        self.model = self._build(weights)
        self.lora = spec.for_model(moe=bool(self.shape.num_experts)) if (spec := config.lora()) else None
        if self.lora is not None:
            lora.attach_lora(self.model, self.lora, config.seed)  # freezes the base: only adapters train
        # MoE: every router consults this for its top-k (the routing-mismatch metric, and R3)
        replay = config.use_rollout_routing_replay
        self.routing = ModelRouting(self.model, replay=replay) if self.shape.num_experts else None
        # The KL reference is the initial model: a LoRA run's frozen base is that already
        self.kl_reference = self.loss_config.kl_coef > 0
        self.reference = (
            self._build(weights).requires_grad_(False).eval() if self.kl_reference and not self.lora else None
        )
        # On GPU the model runs through Megatron's DDP wrapper (Any: Megatron ships no annotations),
        # which owns the gradient buffers and their all-reduce.
        self._ddp: Any = None
        if self.use_gpu:
            self.model = self._ddp = wrap_gpu_model(self.model)
            self.optimizer = build_gpu_optimizer(self.model, config)
        else:
            self.optimizer = build_cpu_optimizer(self.model, config)
        self.state = checkpoint.TrainerState(expert_parallel=config.expert_model_parallel_size)
        path = self.loss_config.custom_advantage_function_path
        self._custom_advantages = load_advantage_function(path) if path else None
        path = self.loss_config.rollout_data_postprocess_path
        self._postprocess = load_postprocess(path) if path else None

    def _build(self, weights: dict[str, Tensor]) -> torch.nn.Module:
        dtype = torch.bfloat16 if self.config.dtype == "bfloat16" else torch.float32
        model = build_gpt_model(
            self.hf_config,
            params_dtype=dtype,
            use_gpu=self.use_gpu,
            tensor_parallel=self.config.tensor_parallel,
            expert_parallel=self.config.expert_model_parallel_size,
        )
        hf_io.load_megatron_into(model, weights)
        return model

    @property
    def weight_version(self) -> int:
        return self.state.weight_version

    @property
    def step(self) -> int:
        return self.state.step

    def _policy(self) -> torch.nn.Module:
        return self._ddp.module if self._ddp is not None else self.model  # the GPTModel under Megatron's DDP

    # ---- inference -------------------------------------------------------------------------

    @torch.no_grad()
    def compute_log_probs(self, samples: Sequence[Sample]) -> list[list[float]]:
        """The policy's log-prob of every response token of each sample (length response_length)."""
        validate_samples(samples)
        out: list[list[float]] = [[] for _ in samples]
        self.model.eval()
        if self.hooks.before_log_prob is not None:
            self.hooks.before_log_prob(self.args, self.model, "")
        for mb in pack_micro_batches(samples, self.config.micro_batch_tokens):
            log_p, _ = self._log_probs(mb.to(self.device))
            for row, i in enumerate(mb.indices):
                out[i] = log_p[row, : samples[i].response_length].tolist()
        return out

    # ---- training --------------------------------------------------------------------------

    def advantages(self, samples: Sequence[Sample]) -> Tensor:
        """[n] per-sample advantages, or [n, R] per-token ones from a custom advantage function."""
        if not self.loss_config.compute_advantages:  # slime's SFT: the loss reads none
            return torch.zeros(len(samples))
        if self._custom_advantages is not None:
            return custom_advantages(self._custom_advantages, self.args, samples)
        return group_normalized_advantages(
            sample_rewards(samples),
            sample_group_ids(samples),
            member_ids=sample_member_ids(samples),
            normalize_std=self.loss_config.advantage_estimator == "grpo",
        )

    def train_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """Advantages over the whole batch, then one optimizer step per `global_batch_size` samples.

        Bumps `weight_version` once (the engines need one update per call). Returns the metrics
        of the last optimizer step (token-weighted means over its micro-batches).
        """
        validate_samples(samples)
        self._check_rollout_log_probs(samples)
        advantages = self.advantages(samples)
        if self._postprocess is not None:  # slime's rollout_id: the rollout step this call trains
            advantages = postprocess(self._postprocess, self.args, self.weight_version, samples, advantages)
        steps = split_global_batches(samples, self.config.global_batch_size)
        # pi_old must be the weights that existed before this call; with one step it equals the
        # detached current log-probs, so the extra forward pass is only paid for several steps.
        old = (
            self.compute_log_probs(samples) if len(steps) > 1 and self.loss_config.old_log_probs == "trainer" else None
        )
        metrics: dict[str, float] = {}
        for step_id, idx in enumerate(steps):
            step_old = None if old is None else [old[i] for i in idx]
            metrics = self._optimizer_step([samples[i] for i in idx], advantages[idx], step_old, step_id)
        self.state.weight_version += 1
        metrics["weight_version"] = float(self.state.weight_version)
        return metrics

    def _check_rollout_log_probs(self, samples: Sequence[Sample]) -> None:
        needs = self.loss_config.old_log_probs == "rollout" or self.loss_config.correction() is not None
        if needs and any(s.rollout_log_probs is None for s in samples):
            raise ValueError("old_log_probs='rollout', tis and icepop need rollout_log_probs on every sample")
        if self.loss_config.use_opd:
            check_teacher_log_probs(samples)

    def _optimizer_step(
        self, samples: list[Sample], advantages: Tensor, old: list[list[float]] | None, step_id: int
    ) -> dict[str, float]:
        rank, world = data_parallel_rank_and_size()
        mine = list(range(rank, len(samples), world))
        local = [samples[i] for i in mine]
        normalizer = self._loss_normalizer(local)
        self.model.train()
        self._zero_grad()
        set_lr(self.optimizer, lr_at(self.state.step, self.config))  # before the hook, which may change it
        if self.hooks.before_train_step is not None:  # slime's rollout_id: the rollout step this call trains
            self.hooks.before_train_step(self.args, self.weight_version, step_id, self.model, self.optimizer, None)
        sums: dict[str, float] = defaultdict(float)
        micro_batches = pack_micro_batches(local, self.config.micro_batch_tokens, advantages[mine])
        idle = 0  # each MoE forward is a collective under expert parallel: pair them up
        if self.config.expert_model_parallel_size > 1:
            idle = align_micro_batch_count(len(micro_batches), self.device) - len(micro_batches)
        if self.shape.num_experts:
            start_moe_step(int(self._data_parallel_sum(len(micro_batches))), self.device)
        for mb in micro_batches:
            old_mb = None if old is None else _rows(mb, [old[i] for i in mine])
            self._micro_batch(mb.to(self.device), old_mb, normalizer, sums)
        if self.shape.num_experts:
            sums["_moe_aux_loss"] = stop_moe_aux_loss(self.device)
            sums["_moe_micro_batches"] = len(micro_batches)
        for mb in [idle_micro_batch()] * idle:
            self._micro_batch(mb.to(self.device), None, normalizer, sums)
        grad_norm = self._apply_gradients()
        sums = sum_over_data_parallel(sums)
        tokens = max(sums.pop("tokens", 0.0), 1.0)
        metrics = {k: v / tokens for k, v in sums.items() if not k.startswith("_")}
        metrics.update({k.removeprefix(HOOK): v / normalizer for k, v in sums.items() if k.startswith(HOOK)})
        metrics.update(loss=sums["_loss"], grad_norm=grad_norm, lr=self.optimizer.param_groups[0]["lr"], tokens=tokens)
        if sums.get("_is_tokens"):
            metrics["rollout_kl"] = sums["_rollout_kl"] / sums["_is_tokens"]
            metrics["is_weight_mean"] = sums["_is_weight"] / sums["_is_tokens"]
            metrics["is_weight_max"] = sums["_is_weight_max"]
            metrics["rollout_logprob_abs_diff_mean"] = sums["_abs_diff"] / sums["_is_tokens"]
            metrics["rollout_logprob_abs_diff_max"] = sums["_abs_diff_max"]
        if self.shape.num_experts:  # mean over MoE layers and the micro-batches of every rank
            layers_x_micro_batches = self.shape.num_moe_layers * max(sums["_moe_micro_batches"], 1)
            metrics["moe_aux_loss"] = sums["_moe_aux_loss"] / layers_x_micro_batches
        if self.routing is not None:
            metrics.update(self.routing.take_mismatch())
        self.state.step += 1
        return metrics

    def _loss_normalizer(self, local: list[Sample]) -> float:
        """Tokens (token aggregation) or sequences (sequence aggregation) in the global batch."""
        if self.loss_config.loss_aggregation == "token":
            count = sum(sum(s.loss_mask) if s.loss_mask is not None else s.response_length for s in local)
        else:
            count = len(local)
        return max(self._data_parallel_sum(count), 1.0)

    def _data_parallel_sum(self, count: float) -> float:
        total = torch.tensor(float(count), device=self.device)
        all_reduce_data_parallel([total])
        return total.item()

    def _log_probs(self, mb: MicroBatch) -> tuple[Tensor, Tensor]:
        """The policy's `response_log_probs`, its MoE routers told the micro-batch's recorded routes."""
        if self.routing is not None:
            self.routing.set_routes(mb.routed_experts)
        return response_log_probs(self.model, mb, self.shape.vocab_size)

    @torch.no_grad()
    def _reference_log_probs(self, mb: MicroBatch) -> Tensor:
        """The KL reference's response log-probs: the frozen copy's, or a LoRA run's base (adapters off)."""
        if self.reference is not None:
            return response_log_probs(self.reference, mb, self.shape.vocab_size)[0]
        with lora.adapters_off(self._policy()):
            return response_log_probs(self.model, mb, self.shape.vocab_size)[0]

    def _micro_batch(self, mb: MicroBatch, old_mb: Tensor | None, normalizer: float, sums: dict) -> None:
        if self.loss_hooks.loss is not None:
            return self._custom_loss(mb, old_mb, normalizer, sums)
        cfg, mask = self.loss_config, mb.loss_mask
        log_p, entropy = self._log_probs(mb)
        trainer_old = log_p.detach() if old_mb is None else old_mb.to(self.device)
        old = mb.rollout_log_probs if cfg.old_log_probs == "rollout" else trainer_old
        advantages = mb.advantages
        if cfg.use_opd:  # slime's student log-probs are pi_old's: the trainer's, or the engine's
            advantages, reverse_kl = L.opd_advantages(advantages, old, mb.teacher_log_probs, cfg.opd_kl_coef)
        per_token, stats = L.policy_loss(cfg, log_p, old, advantages, mask)
        if cfg.use_opd:
            stats["opd_kl"] = L.masked_mean(reverse_kl, mask)
        pg_mask, per_token_loss = mask, cfg.loss_aggregation == "token"
        if self.loss_hooks.tis is not None:  # slime's custom TIS, in place of --tis-mode's weights
            hooked = self.loss_hooks.correct(self.args, per_token, trainer_old, mb, per_token_loss)
            per_token, pg_mask, hook_stats = hooked
            _add_hook_sums(sums, hook_stats)
        elif cfg.correction() is not None:
            weights, correction_stats = L.off_policy_correction(cfg, trainer_old, mb.rollout_log_probs, mask)
            per_token = per_token * weights
            stats.update(correction_stats)
        stats["pg_loss"] = L.masked_mean(per_token, mask).detach()
        extra = torch.zeros_like(per_token)  # the KL and entropy terms, reduced by --loss-aggregation
        if self.kl_reference:
            ref_log_p = self._reference_log_probs(mb)
            kl = L.kl_penalty(log_p, ref_log_p, cfg.kl_estimator)
            extra = extra + cfg.kl_coef * kl
            stats["ref_kl"] = L.masked_mean(kl, mask).detach()
        if cfg.entropy_coef:
            extra = extra - cfg.entropy_coef * entropy
        if self.loss_hooks.reduce_pg:  # slime's reduction (a custom reducer, or a TIS hook's masks)
            pg = self.loss_hooks.reduce(per_token, pg_mask, mb, per_token_loss) / normalizer
            loss = pg + L.aggregate(extra, mask, cfg.loss_aggregation, normalizer)
        else:
            loss = L.aggregate(per_token + extra, mask, cfg.loss_aggregation, normalizer)
        loss.backward()
        n = mask.sum().item()
        stats["entropy"] = L.masked_mean(entropy.detach(), mask)
        for k, v in stats.items():
            sums[k] += v.item() * n
        sums["_loss"] += loss.item()  # this rank's share of the global batch loss
        sums["tokens"] += n
        self._rollout_stats(trainer_old, mb, sums)

    def _custom_loss(self, mb: MicroBatch, old_mb: Tensor | None, normalizer: float, sums: dict) -> None:
        """slime's custom loss on a micro-batch: its reduced loss over the global batch's normaliser."""
        cfg, custom_loss = self.loss_config, self.loss_hooks.loss
        assert custom_loss is not None  # called only with --loss-type custom_loss
        logits = packed_logits(gpt_logits(self.model, mb.input_ids, self.shape.vocab_size), mb)
        if old_mb is None:  # one optimizer step: pi_old is the current policy, detached
            old_mb = packed_response_log_probs(logits.detach(), mb)
        ref = self._reference_log_probs(mb) if self.kl_reference else None
        batch = rollout_batch(mb, old_mb.to(self.device), ref)
        per_token_loss = cfg.loss_aggregation == "token"
        reduce = get_sum_of_sample_mean(
            batch["total_lengths"], batch["response_lengths"], batch["loss_masks"], None, per_token_loss
        )
        loss, log = custom_loss(self.args, batch, logits, reduce)
        loss = loss / normalizer
        loss.backward()
        _add_hook_sums(sums, log)
        sums["_loss"] += loss.item()
        sums["tokens"] += mb.loss_mask.sum().item()
        self._rollout_stats(old_mb.to(self.device), mb, sums)

    @staticmethod
    def _rollout_stats(trainer_log_p: Tensor, mb: MicroBatch, sums: dict) -> None:
        """Trainer-vs-engine agreement on tokens the engine reported log-probs for."""
        mask = mb.loss_mask * mb.has_rollout.unsqueeze(-1).float()
        if not mask.any():
            return
        diff = (mb.rollout_log_probs - trainer_log_p) * mask
        weight = (trainer_log_p - mb.rollout_log_probs).exp() * mask
        sums["_is_tokens"] += mask.sum().item()
        sums["_rollout_kl"] += diff.sum().item()  # k1 estimate of KL(rollout || trainer)
        sums["_is_weight"] += weight.sum().item()
        sums["_is_weight_max"] = max(sums["_is_weight_max"], weight.max().item())
        sums["_abs_diff"] += diff.abs().sum().item()
        sums["_abs_diff_max"] = max(sums["_abs_diff_max"], diff.abs().max().item())

    def _zero_grad(self) -> None:
        if self._ddp is not None:
            self._ddp.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _apply_gradients(self) -> float:
        if self._ddp is not None:
            self._ddp.finish_grad_sync()  # all-reduce over data-parallel ranks
            world = data_parallel_rank_and_size()[1]
            if world > 1:  # Megatron's DDP averages; each rank's loss is its share of the batch's: sum
                self._ddp.scale_gradients(float(world))
            _, grad_norm, _ = self.optimizer.step()  # Megatron clips to config.clip_grad inside
            return float(grad_norm or 0.0)
        if data_parallel_rank_and_size()[1] > 1:
            self._sum_gradients_over_ranks()
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.config.clip_grad or float("inf")
        if self.config.expert_model_parallel_size > 1:
            grad_norm = expert_parallel_grad_norm(params)
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, grad_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        self.optimizer.step()
        return grad_norm.item()

    def _sum_gradients_over_ranks(self) -> None:
        """No DDP on CPU: each rank's loss is its share of the global batch's, so the summed
        gradients are the whole batch's, and every rank takes the same step. A rank whose stripe
        was empty (fewer samples than ranks) has no gradients yet: it adds zeros. Under expert
        parallel a routed expert's gradient already holds every rank's tokens (the dispatcher
        brought them): it is summed only over the ranks holding the same experts."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for experts in (False, True):
            grads = [p.grad for p in params if p.grad is not None and getattr(p, "allreduce", True) != experts]
            all_reduce_data_parallel(grads, experts=experts)

    # ---- weights and checkpoints -----------------------------------------------------------

    def hf_state_dict(self) -> dict[str, Tensor]:
        """The current policy weights with Hugging Face names, on CPU (tied models: no lm_head)."""
        return hf_io.gather_hf_state_dict(self._policy(), self.shape)

    def export_hf(self, out_dir: str | Path) -> Path:
        """A HF checkpoint directory that `from_pretrained` and SGLang load (written by global rank 0;
        every rank must call it, since gathering tensor-parallel shards is a collective)."""
        state = self.hf_state_dict()
        if global_rank() == 0:
            hf_io.write_hf_checkpoint(state, Path(out_dir), self.config.model_path)
        return Path(out_dir)

    def export_peft(self, out_dir: str | Path) -> Path:
        """The LoRA adapters as a PEFT adapter directory for the HF base model (`PeftModel.from_pretrained`,
        SGLang's `/load_lora_adapter`); written by global rank 0, called by every rank."""
        if self.lora is None:
            raise ValueError("export_peft needs a LoRA run (--lora-rank > 0)")
        full = lora.full_adapter_weights(self._policy())
        if global_rank() == 0:
            tensors = lora.peft_state_dict(full, self.shape)
            config = lora.peft_config(self.lora, str(self.config.model_path), tensors)
            lora.write_peft_adapter(Path(out_dir), tensors, config)
        return Path(out_dir)

    def save(self, out_dir: str | Path, data_state: dict[str, Any] | None = None) -> Path:
        if data_state is not None:
            self.state.data_state = data_state
        return checkpoint.save_checkpoint(Path(out_dir), model=self.model, optimizer=self.optimizer, state=self.state)

    def load(self, ckpt_dir: str | Path) -> dict[str, Any]:
        """Restore model, optimizer and counters; returns the saved data position."""
        self.state = checkpoint.load_checkpoint(
            Path(ckpt_dir),
            model=self.model,
            optimizer=self.optimizer,
            expert_parallel=self.config.expert_model_parallel_size,
        )
        return self.state.data_state


HOOK = "_hook:"  # sums of the metrics slime's loss hooks return, reduced per micro-batch


def _add_hook_sums(sums: dict, metrics: dict[str, Any]) -> None:
    for k, v in metrics.items():
        sums[HOOK + k] += float(v)


def _rows(mb: MicroBatch, per_sample: list[list[float]]) -> Tensor:
    out = torch.zeros_like(mb.loss_mask)
    for row, i in enumerate(mb.indices):
        out[row, : len(per_sample[i])] = torch.tensor(per_sample[i])
    return out


def check_teacher_log_probs(samples: Sequence[Sample]) -> None:
    """OPD trains on a teacher log-prob per response token: refuse a batch that lacks them."""
    for s in samples:
        n = None if s.teacher_log_probs is None else len(s.teacher_log_probs)
        if n != s.response_length:
            raise ValueError(
                f"--use-opd: sample {s.session_id or s.index} has {n} teacher_log_probs for {s.response_length} "
                "response tokens; a --custom-reward-post-process-path sets one per response token (slime's "
                "on_policy_distillation.post_process_rewards does, from a teacher's input_token_logprobs)"
            )
