"""Feasibility check of the demo's learning problem, without the stack: GRPO in one process.

Samples episodes with `model.generate` (turn 1: the tool call; the tool runs in-process; turn 2:
the answer), scores them with the demo's reward, and takes one on-policy policy-gradient step per
batch with group-normalised advantages (GRPO with a single update per rollout, so the PPO ratio
is 1 and clipping never triggers). It answers one question before the full stack is wired: does
the reward on held-out prompts go from ≤ 0.3 after the warm-start to ≥ 0.8, with which settings,
and how fast on a small CPU? It is a measuring tool, not the demo: `slimeish train` runs the real
path (router capture, Redis buffer, Megatron trainer, weight sync).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from examples.demo.task import TOOLS, Problem, TaskConfig, call_tool, format_tool_result, make_splits, reward
from slimeish.common.config import add_dataclass_args, from_namespace, help_field

_TOOL_CALL_RE = re.compile(r"^\s*<tool_call>\s*(.*?)\s*</tool_call>\s*$", re.S)


@dataclass(kw_only=True)
class GRPOConfig:
    steps: int = help_field(40, help="GRPO steps (one rollout batch and one optimizer step each)")
    prompts_per_step: int = help_field(8, help="prompts (groups) per step")
    n_samples: int = help_field(8, help="samples per prompt")
    lr: float = help_field(1e-3, help="AdamW learning rate")
    warmup_steps: int = help_field(5, help="linear learning-rate warm-up (Adam's first steps are full-size)")
    adam_eps: float = help_field(1e-8, help="AdamW epsilon (larger damps steps on parameters with tiny gradients)")
    kl_coef: float = help_field(0.0, help="weight of the k3 KL penalty to the warm-started model (0: none)")
    max_new_tokens: int = help_field(40, help="per turn")
    eval_every: int = help_field(5, help="evaluate every N steps")
    seed: int = help_field(1, help="sampling seed")
    threads: int = help_field(2, help="torch CPU threads")


@dataclass
class Episode:
    ids: list[int]
    mask: list[int]  # 1 on sampled tokens
    reward: float


def _render(tokenizer, messages, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=TOOLS, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def _generate(model, tokenizer, contexts: list[list[int]], max_new_tokens: int, greedy: bool) -> list[list[int]]:
    """Sample (temperature 1, or greedy) one continuation per context, cut after the first <|im_end|>."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    width = max(map(len, contexts))
    input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
    attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    out = model.generate(
        input_ids=input_ids, attention_mask=attention, do_sample=not greedy, temperature=1.0, top_k=0, top_p=1.0,
        max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos,
    )  # fmt: skip
    rows = []
    for row in out[:, width:].tolist():
        rows.append(row[: row.index(eos) + 1] if eos in row else row)
    return rows


def _tool_turn(tokenizer, problem: Problem, text: str) -> str | None:
    """The tool result the agent would send back, or None when the output is not one valid call."""
    match = _TOOL_CALL_RE.match(text)
    try:
        call = json.loads(match.group(1)) if match else None
        return format_tool_result(call_tool(call["name"], call["arguments"]))
    except (ValueError, TypeError, KeyError):  # unparseable or wrong call: the episode scores 0
        return None


def rollout(
    model, tokenizer, problems: list[Problem], n: int, max_new_tokens: int, greedy: bool = False
) -> list[Episode]:
    """n episodes per problem: generate the call, run the tool, generate the answer, score."""
    eos_text = tokenizer.eos_token
    prompts = [_render(tokenizer, [{"role": "user", "content": p.question}], True) for p in problems for _ in range(n)]
    flat = [p for p in problems for _ in range(n)]
    prompt_ids = [_encode(tokenizer, t) for t in prompts]
    first = _generate(model, tokenizer, prompt_ids, max_new_tokens, greedy)
    episodes: list[Episode | None] = [None] * len(flat)
    second_ctx, second_idx, tails = [], [], []
    for i, (problem, out) in enumerate(zip(flat, first, strict=True)):
        text = tokenizer.decode(out, skip_special_tokens=False).removesuffix(eos_text)
        result = _tool_turn(tokenizer, problem, text)
        ids, mask = prompt_ids[i] + out, [0] * len(prompt_ids[i]) + [1] * len(out)
        if result is None:
            episodes[i] = Episode(ids, mask, 0.0)
            continue
        tail = _encode(
            tokenizer,
            "\n<|im_start|>user\n<tool_response>\n" + result + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        )
        second_ctx.append(ids + tail)
        second_idx.append(i)
        tails.append((ids, mask, tail))
    if second_ctx:
        second = _generate(model, tokenizer, second_ctx, max_new_tokens, greedy)
        for i, (ids, mask, tail), out in zip(second_idx, tails, second, strict=True):
            answer = tokenizer.decode(out, skip_special_tokens=False).removesuffix(eos_text)
            episodes[i] = Episode(
                ids + tail + out, mask + [0] * len(tail) + [1] * len(out), reward(answer, flat[i].label)
            )
    return episodes  # type: ignore[return-value]


def grpo_loss(model, ref, episodes: list[Episode], n: int, pad_id: int, kl_coef: float) -> torch.Tensor:
    """Mean over samples of the token mean of -advantage * log-prob (+ kl_coef * k3 KL to `ref`)."""
    rewards = torch.tensor([e.reward for e in episodes]).view(-1, n)
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).flatten()
    width = max(len(e.ids) for e in episodes)
    ids = torch.full((len(episodes), width), pad_id)
    mask = torch.zeros((len(episodes), width))
    attention = torch.zeros((len(episodes), width), dtype=torch.long)
    for i, e in enumerate(episodes):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        mask[i, : len(e.ids)] = torch.tensor(e.mask, dtype=torch.float)
        attention[i, : len(e.ids)] = 1
    logp = _token_logprobs(model, ids, attention)
    per_token = -adv[:, None] * logp
    if kl_coef:
        with torch.no_grad():
            ref_logp = _token_logprobs(ref, ids, attention)
        log_ratio = ref_logp - logp
        per_token = per_token + kl_coef * (log_ratio.exp() - log_ratio - 1)  # k3: unbiased, >= 0
    m = mask[:, 1:]
    return ((per_token * m).sum(1) / m.sum(1).clamp(min=1)).mean()


def _token_logprobs(model, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def evaluate(model, tokenizer, problems: list[Problem], max_new_tokens: int) -> tuple[float, float]:
    """Mean reward on `problems`: sampled at temperature 1, and greedy."""
    model.eval()
    sampled, greedy = (rollout(model, tokenizer, problems, 1, max_new_tokens, g) for g in (False, True))
    return sum(e.reward for e in sampled) / len(sampled), sum(e.reward for e in greedy) / len(greedy)


def train(model_dir: Path, cfg: GRPOConfig, task: TaskConfig) -> list[tuple[int, float, float, float]]:
    """Run GRPO from `model_dir`; returns the curve as (step, eval reward T=1, greedy, seconds)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval() if cfg.kl_coef else None
    train_set, eval_set = make_splits(task)
    rng = random.Random(cfg.seed)
    # betas as slimeish's trainer defaults
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=cfg.adam_eps, weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / (cfg.warmup_steps + 1)))
    start, curve = time.monotonic(), []
    for step in range(cfg.steps + 1):
        if step % cfg.eval_every == 0 or step == cfg.steps:
            curve.append((step, *evaluate(model, tokenizer, eval_set, cfg.max_new_tokens), time.monotonic() - start))
            _, sampled, greedy, seconds = curve[-1]
            print(f"step {step:3d} eval reward {sampled:.3f} (T=1) {greedy:.3f} (greedy) ({seconds:.0f}s)", flush=True)
        if step == cfg.steps:
            break
        model.eval()
        episodes = rollout(
            model, tokenizer, rng.sample(train_set, cfg.prompts_per_step), cfg.n_samples, cfg.max_new_tokens
        )
        model.train()
        loss = grpo_loss(model, ref, episodes, cfg.n_samples, tokenizer.pad_token_id, cfg.kl_coef)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        warmup.step()
        optimizer.zero_grad(set_to_none=True)
        mean = sum(e.reward for e in episodes) / len(episodes)
        print(f"step {step + 1:3d} train reward {mean:.3f} ({time.monotonic() - start:.0f}s)", flush=True)
    return curve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="warm-started model (examples.demo.sft)")
    add_dataclass_args(parser, GRPOConfig, "grpo")
    add_dataclass_args(parser, TaskConfig, "task")
    args = parser.parse_args(argv)
    train(args.model_dir, from_namespace(GRPOConfig, args), from_namespace(TaskConfig, args))


if __name__ == "__main__":
    main()
