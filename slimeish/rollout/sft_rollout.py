"""slime's SFT rollout under slime's name (`--rollout-function-path slimeish.rollout.sft_rollout.generate_rollout`):
nothing is generated; each prompt's conversation (`--input-key messages`) is tokenized with its loss mask
read from the chat template (`slimeish.utils.mask_utils`), and trained on with `--loss-type sft_loss`.
Groups are of one conversation: training one several times per step would only repeat it."""

from __future__ import annotations

import functools
from typing import Any

from slimeish.common.sample import Sample
from slimeish.utils.mask_utils import MultiTurnLossMaskGenerator
from slimeish.utils.processing_utils import load_tokenizer

__all__ = ["generate_rollout"]


@functools.cache
def _mask_generator(checkpoint: str, loss_mask_type: str) -> MultiTurnLossMaskGenerator:
    return MultiTurnLossMaskGenerator(load_tokenizer(checkpoint), tokenizer_type=loss_mask_type)


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> list[list[Sample]]:
    """`args.rollout_batch_size` groups of one conversation each, tokenized, with reward 0."""
    if evaluation:
        raise ValueError("slime's SFT rollout has no evaluation: drop --eval-prompt-data")
    groups = data_source.get_samples(args.rollout_batch_size)
    masks = _mask_generator(args.hf_checkpoint, args.loss_mask_type)
    for group in groups:
        if len(group) != 1:
            raise ValueError(f"the SFT rollout trains a conversation once: --n-samples-per-prompt 1, not {len(group)}")
        (sample,) = group
        tokens, loss_mask = masks.get_loss_mask(sample.prompt, tools=sample.metadata.get("tools"))
        (response_length,) = masks.get_response_lengths([loss_mask])
        sample.tokens, sample.response_length, sample.reward = tokens, response_length, 0
        sample.loss_mask = loss_mask[-response_length:]
    return groups
