"""Sample builders and weight loading shared by the trainer tests."""

from __future__ import annotations

import random

import httpx
import torch

from slimeish.common.sample import Sample
from slimeish.trainer.convert import hf_to_megatron
from slimeish.trainer.hf_io import load_megatron_into
from slimeish.trainer.model import ModelShape
from slimeish.trainer.trainer import Trainer


def load_hf_into(model: torch.nn.Module, hf: dict[str, torch.Tensor], shape: ModelShape) -> None:
    """Convert, take this tensor-parallel rank's shard and copy into `model` (all names must match)."""
    load_megatron_into(model, hf_to_megatron(hf, shape))


def random_samples(n_groups: int, group_size: int, seed: int = 0, vocab: int = 800) -> list[Sample]:
    """Random token sequences (no rollout log-probs) with random rewards."""
    rng = random.Random(seed)
    out = []
    for g in range(n_groups):
        for i in range(group_size):
            p, r = rng.randint(3, 8), rng.randint(2, 6)
            out.append(
                Sample(group_index=g, index=i, tokens=[rng.randrange(vocab) for _ in range(p + r)],
                       response_length=r, loss_mask=[1] * r, reward=rng.random())
            )  # fmt: skip
    return out


def engine_samples(
    url: str,
    prompts: list[list[int]],
    group_size: int,
    max_new_tokens: int,
    seed: int = 0,
    lora_path: str | None = None,
):
    """Sample `group_size` answers per prompt from an engine at temperature 1, with its log-probs
    (with LoRA adapter `lora_path` when given).

    Returns (samples, weight versions reported by the engine)."""
    samples, versions = [], set()
    with httpx.Client(timeout=60) as client:
        for g, prompt in enumerate(prompts):
            for i in range(group_size):
                body = {
                    "input_ids": prompt,
                    "sampling_params": {
                        "max_new_tokens": max_new_tokens,
                        "temperature": 1.0,
                        "sampling_seed": seed + i,
                    },
                    "return_logprob": True,
                } | ({"lora_path": lora_path} if lora_path else {})
                reply = client.post(f"{url}/generate", json=body).raise_for_status().json()
                out = reply["output_ids"]
                logprobs = [lp for lp, _, _ in reply["meta_info"]["output_token_logprobs"]]
                versions.add(reply["meta_info"]["weight_version"])
                samples.append(
                    Sample(group_index=g, index=i, tokens=prompt + out, response_length=len(out),
                           loss_mask=[1] * len(out), rollout_log_probs=logprobs, reward=0.0)
                )  # fmt: skip
    return samples, versions


def router_samples(router: str, admin_token: str, prompts: list[list[int]], group_size: int, max_new_tokens: int):
    """Samples produced through the router: one session per answer, token-in `/s/<key>/generate`."""
    samples = []
    with httpx.Client(timeout=60) as client:
        for g, prompt in enumerate(prompts):
            for i in range(group_size):
                session = (
                    client.post(
                        f"{router}/sessions",
                        json={"group_id": f"g{g}", "index": i, "group_size": group_size, "metadata": {}},
                        headers={"Authorization": f"Bearer {admin_token}"},
                    )
                    .raise_for_status()
                    .json()
                )
                body = {"input_ids": prompt, "return_logprob": True,
                        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0}}  # fmt: skip
                reply = client.post(f"{router}/s/{session['api_key']}/generate", json=body).raise_for_status().json()
                out = reply["output_ids"]
                logprobs = [lp for lp, _, _ in reply["meta_info"]["output_token_logprobs"]]
                samples.append(
                    Sample(group_index=g, index=i, tokens=prompt + out, response_length=len(out),
                           loss_mask=[1] * len(out), rollout_log_probs=logprobs, reward=float(i % 2))
                )  # fmt: skip
    return samples


def max_log_prob_gap(trainer: Trainer, samples: list[Sample]) -> float:
    """The largest |trainer log-prob - sampled log-prob| over `samples`' tokens (float64)."""
    ours = trainer.compute_log_probs(samples)
    return max(
        (torch.tensor(a, dtype=torch.float64) - torch.tensor(s.rollout_log_probs, dtype=torch.float64))
        .abs()
        .max()
        .item()
        for a, s in zip(ours, samples, strict=True)
    )
