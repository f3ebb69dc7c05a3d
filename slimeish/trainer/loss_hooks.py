"""slime's loss hooks, with slime's signatures, called where slime's loss calls them:

- `--custom-loss-function-path` (with `--loss-type custom_loss`):
  `def loss(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)`, once per micro-batch in
  place of the built-in loss. `logits` is `[1, T, V]` fp32: the micro-batch's sequences packed
  end to end, as slime's (no padding between them); `batch` holds slime's per-sample lists (see
  `rollout_batch`); `sum_of_sample_mean(x)` reduces a flat per-token tensor over the samples.
- `--custom-tis-function-path` (with `--tis`): `def tis(args, *, pg_loss, train_log_probs,
  rollout_log_probs, loss_masks, total_lengths, response_lengths, **kwargs) -> (pg_loss, loss_masks,
  metrics)`, on the policy loss in place of `--tis-mode`'s weights; the masks it returns are the
  numerators of the reduction (rejected tokens drop out), the denominators stay the original ones.
- `--custom-pg-loss-reducer-function-path`: `def reducer(total_lengths, response_lengths,
  loss_masks, calculate_per_token_loss) -> Callable[[Tensor], Tensor]`, reducing the policy loss
  in place of `--loss-aggregation`'s (the KL and entropy terms keep it).

slime's reductions are sums over the micro-batch (of per-sample means, or of tokens with
`calculate_per_token_loss`); the trainer divides them by the global batch's samples (tokens), as
its own `--loss-aggregation`, so gradient accumulation is exact. Per-token tensors are flat: each
sample's response tokens, one sample after the other. Log-probs are at temperature 1, as the
trainer's own. A metric a hook returns is logged as its sum over the step / that normaliser.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from slimeish.common.plugins import load_function
from slimeish.trainer.batching import MicroBatch
from slimeish.trainer.config import LossConfig

LOSS_SIGNATURE = (
    "def loss(args, batch: dict, logits: Tensor, sum_of_sample_mean: Callable[[Tensor], Tensor]) -> "
    "tuple[Tensor, dict[str, Tensor]]"
)
TIS_SIGNATURE = (
    "def tis(args, *, pg_loss: Tensor, train_log_probs: list[Tensor], rollout_log_probs: list[Tensor], "
    "loss_masks: list[Tensor], total_lengths: list[int], response_lengths: list[int], **kwargs) -> "
    "tuple[Tensor, list[Tensor], dict[str, Tensor]]"
)
REDUCER_SIGNATURE = (
    "def reducer(total_lengths: list[int], response_lengths: list[int], loss_masks: list[Tensor], "
    "calculate_per_token_loss: bool) -> Callable[[Tensor], Tensor]"
)
LOSS_PARAMS = ["args", "batch", "logits", "sum_of_sample_mean"]
TIS_KEYWORDS = ["pg_loss", "train_log_probs", "rollout_log_probs", "loss_masks", "total_lengths", "response_lengths"]

Reduce = Callable[[Tensor], Tensor]


def get_sum_of_sample_mean(
    total_lengths: Sequence[int],
    response_lengths: Sequence[int],
    loss_masks: Sequence[Tensor],
    sample_denoms: Sequence[Tensor] | None = None,
    calculate_per_token_loss: bool = False,
) -> Reduce:
    """slime's reduction of a flat per-token tensor (slime's signature; `total_lengths` place context
    parallel chunks there, and there is no context parallelism here): the sum over samples of each one's masked mean
    (denominators: `sample_denoms`, default each mask's sum), or with `calculate_per_token_loss` the
    masked sum of all tokens."""
    denoms = [m.sum() for m in loss_masks] if sample_denoms is None else sample_denoms

    def reduce(x: Tensor) -> Tensor:
        parts = zip(x.split(list(response_lengths)), loss_masks, denoms, strict=True)
        if calculate_per_token_loss:
            return torch.stack([(x_i * m).sum() for x_i, m, _ in parts]).sum()
        return torch.stack([(x_i * m).sum() / d.clamp(min=1) for x_i, m, d in parts]).sum()

    return reduce


def rows(values: Tensor, lengths: Sequence[int]) -> list[Tensor]:
    """[b, R] right-padded -> one tensor per row, cut to its length."""
    return [values[i, :n] for i, n in enumerate(lengths)]


def pad(flat: Tensor, lengths: Sequence[int], width: int) -> Tensor:
    """Flat per-token values -> [b, width], zero-padded (the inverse of `rows` + cat)."""
    out = flat.new_zeros(len(lengths), width)
    for i, part in enumerate(flat.split(list(lengths))):
        out[i, : len(part)] = part
    return out


def get_log_probs_and_entropy(
    logits: Tensor,
    *,
    args: Any = None,
    unconcat_tokens: Sequence[Tensor],
    total_lengths: Sequence[int],
    response_lengths: Sequence[int],
    with_entropy: bool = False,
    **_: Any,
) -> tuple[Tensor, dict[str, list[Tensor]]]:
    """slime's helper for custom losses: each sample's response-token log-probs (and entropies) from
    packed `logits` [1, T, V], at temperature 1. Returns (an empty tensor, {"log_probs": [...],
    "entropy": [...]}), as slime's."""
    packed = logits.squeeze(0).float()
    log_probs: list[Tensor] = []
    entropy: list[Tensor] = []
    end = 0
    for tokens, total, resp in zip(unconcat_tokens, total_lengths, response_lengths, strict=True):
        end += total
        log_p = torch.log_softmax(packed[end - resp - 1 : end - 1], dim=-1)
        log_probs.append(log_p.gather(-1, tokens[-resp:].unsqueeze(-1).to(log_p.device)).squeeze(-1))
        if with_entropy:
            entropy.append(-(log_p.exp() * log_p).sum(-1))
    out = {"log_probs": log_probs} | ({"entropy": entropy} if with_entropy else {})
    return torch.empty(0, device=logits.device), out


@dataclass
class LossHooks:
    """The loaded loss hooks of a run; None where the flag was not given."""

    loss: Callable[..., Any] | None = None
    tis: Callable[..., Any] | None = None
    reducer: Callable[..., Any] | None = None

    @classmethod
    def load(cls, cfg: LossConfig) -> LossHooks:
        """Import each given hook and check its signature (errors state the expected one)."""
        return cls(
            loss=_load(cfg.custom_loss_function_path, LOSS_SIGNATURE, LOSS_PARAMS),
            tis=_load(cfg.custom_tis_function_path, TIS_SIGNATURE, ["args"], TIS_KEYWORDS),
            reducer=_load(
                cfg.custom_pg_loss_reducer_function_path,
                REDUCER_SIGNATURE,
                ["total_lengths", "response_lengths", "loss_masks", "calculate_per_token_loss"],
            ),
        )

    @property
    def reduce_pg(self) -> bool:
        """Whether the policy loss is reduced here (slime's way) instead of by `losses.aggregate`."""
        return self.tis is not None or self.reducer is not None

    def correct(
        self, args: argparse.Namespace, pg_loss: Tensor, train_log_probs: Tensor, mb: MicroBatch, per_token_loss: bool
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The TIS hook on a micro-batch's [b, R] policy loss: (weighted loss [b, R], the masks to
        reduce it with [b, R], its metrics reduced by the original masks)."""
        assert self.tis is not None
        lengths, masks = _lengths(mb), rows(mb.loss_mask, _lengths(mb))
        out, new_masks, metrics = self.tis(
            args,
            pg_loss=torch.cat(rows(pg_loss, lengths)),
            train_log_probs=rows(train_log_probs, lengths),
            rollout_log_probs=rows(mb.rollout_log_probs, lengths),
            loss_masks=masks,
            total_lengths=_total_lengths(mb),
            response_lengths=lengths,
        )
        width = mb.loss_mask.shape[1]
        reduce = get_sum_of_sample_mean(_total_lengths(mb), lengths, masks, None, per_token_loss)
        reduced = {k: reduce(torch.as_tensor(v).flatten().to(pg_loss.device)).detach() for k, v in metrics.items()}
        return pad(out, lengths, width), pad(torch.cat([m.float() for m in new_masks]), lengths, width), reduced

    def reduce(self, per_token: Tensor, pg_mask: Tensor, mb: MicroBatch, per_token_loss: bool) -> Tensor:
        """slime's reduction of the [b, R] policy loss: the reducer hook's, else the per-sample mean
        (or token sum) with `pg_mask` as numerators and the micro-batch's loss masks as denominators."""
        lengths = _lengths(mb)
        masks = rows(pg_mask, lengths)
        if self.reducer is not None:
            fn = self.reducer(_total_lengths(mb), lengths, masks, per_token_loss)
        else:
            denoms = [m.sum() for m in rows(mb.loss_mask, lengths)]
            fn = get_sum_of_sample_mean(_total_lengths(mb), lengths, masks, denoms, per_token_loss)
        return fn(torch.cat(rows(per_token, lengths)))


def rollout_batch(mb: MicroBatch, old_log_probs: Tensor, ref_log_probs: Tensor | None) -> dict[str, Any]:
    """slime's `batch` of a micro-batch for a custom loss: per-sample lists (flat per-token tensors
    over the response) under slime's keys."""
    lengths = _lengths(mb)
    totals = _total_lengths(mb)
    masks = rows(mb.loss_mask, lengths)
    batch: dict[str, Any] = {
        "unconcat_tokens": rows(mb.input_ids, totals),
        "tokens": rows(mb.input_ids, totals),
        "total_lengths": totals,
        "response_lengths": lengths,
        "loss_masks": masks,
        "rollout_mask_sums": [m.sum() for m in masks],
        "advantages": rows(mb.advantages, lengths),
        "log_probs": rows(old_log_probs, lengths),
        "rollout_log_probs": rows(mb.rollout_log_probs, lengths) if bool(mb.has_rollout.all()) else [],
    }
    if ref_log_probs is not None:
        batch["ref_log_probs"] = rows(ref_log_probs, lengths)
    return batch


def packed_logits(logits: Tensor, mb: MicroBatch) -> Tensor:
    """[b, L, V] right-padded -> [1, T, V] fp32, the sequences end to end (slime's layout)."""
    return torch.cat(rows(logits, _total_lengths(mb))).unsqueeze(0).float()


def packed_response_log_probs(logits: Tensor, mb: MicroBatch) -> Tensor:
    """[b, R] log-probs of the response tokens from `packed_logits` (zero-padded)."""
    lengths, totals = _lengths(mb), _total_lengths(mb)
    _, out = get_log_probs_and_entropy(
        logits, unconcat_tokens=rows(mb.input_ids, totals), total_lengths=totals, response_lengths=lengths
    )
    return pad(torch.cat(out["log_probs"]), lengths, mb.loss_mask.shape[1])


def _lengths(mb: MicroBatch) -> list[int]:
    return [int(n) for n in mb.response_lengths.tolist()]


def _total_lengths(mb: MicroBatch) -> list[int]:
    return [int(n) for n in (mb.response_start + 1 + mb.response_lengths).tolist()]


def _load(
    path: str | None, expected: str, params: list[str], keywords: Sequence[str] = ()
) -> Callable[..., Any] | None:
    if not path:
        return None
    return load_function(path, expected=expected, params=params, is_async=False, keywords=keywords)


def slime_loss_args(cfg: LossConfig) -> dict[str, Any]:
    """slime's names for the loss options its hooks read (`args.use_tis`, `args.tis_clip`, ...)."""
    return {
        "use_tis": cfg.tis,
        "tis_clip": cfg.tis_clip_high,
        "calculate_per_token_loss": cfg.loss_aggregation == "token",
        "use_rollout_logprobs": cfg.old_log_probs == "rollout",
        "use_kl_loss": cfg.kl_coef > 0,
        "kl_loss_coef": cfg.kl_coef,
        "kl_loss_type": cfg.kl_estimator,
        "eps_clip_c": cfg.dual_clip_c,
        "rollout_temperature": 1.0,  # the trainer's log-probs are at temperature 1
        "context_parallel_size": 1,
        "allgather_cp": False,
    }
