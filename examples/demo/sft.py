"""Warm-start: a short supervised fine-tune that teaches the demo's tool-call *format*.

A freshly initialised tiny model cannot write a tool call, so GRPO would have no reward to learn
from. This stage trains on synthetic transcripts (question -> tool call with the two numbers ->
tool result -> "The answer is N.") in plain PyTorch on CPU. The transcripts come from a *sloppy
teacher* that mixes up inverse operations: it calls the right tool 20 % of the time, the inverse
operation's tool (add<->sub, mul<->div) 50 %, and each of the other two 15 %. The warm-started
model learns the format, to copy numbers, and the teacher's bad habit: sampled at temperature 1 it
is right about 1/5 of the time, and greedy decoding picks the inverse tool, so it is almost never
right. Everything above that in the demo is learned by RL. (A teacher that picks uniformly at
random, independent of the question, gives the same start, but then RL has to build the feature
that reads the question word from scratch, and on this 2-layer model that took 200+ steps.)

Transcripts are rendered with the model's own chat template, turn by turn the way the router
renders them, and the loss covers the assistant's tokens only (what the policy will sample).

Copying the numbers (into the call, then from the tool result into the answer) is the slow part
for a tiny, randomly initialised model, and the tools block the template puts in front of every
prompt makes each transcript ~8x longer. So the warm-start runs in two phases: first the same
turns rendered without the tools block (short, cheap, big batches, same relative layout of
question and answer, which is what rotary attention learns from), then a few steps on the full
prompt the router will render, so the model is at home in its real context.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.demo.task import (
    TOOL_NAMES,
    TOOLS,
    Problem,
    TaskConfig,
    call_tool,
    format_answer,
    format_tool_result,
    make_splits,
)
from slimeish.common.config import add_dataclass_args, from_namespace, help_field


@dataclass(kw_only=True)
class FineTuneConfig:
    """The optimizer and run of a warm-start, whatever its transcripts (`fine_tune`)."""

    lr: float = help_field(3e-3, help="peak AdamW learning rate (linear warm-up, cosine decay over all steps)")
    warmup_steps: int = help_field(20, help="linear warm-up steps")
    seed: int = help_field(0, help="seed for the teacher's choices and data order")
    threads: int = help_field(2, help="torch CPU threads")


@dataclass(kw_only=True)
class SFTConfig(FineTuneConfig):
    short_steps: int = help_field(500, help="phase 1 steps on transcripts without the tools block")
    short_batch_size: int = help_field(64, help="phase 1 transcripts per step")
    steps: int = help_field(500, help="phase 2 steps, every other one on full transcripts (as the router renders)")
    batch_size: int = help_field(8, help="phase 2 transcripts per step")
    teacher_right: float = help_field(0.2, help="how often a transcript calls the right tool")
    teacher_inverse: float = help_field(
        0.5, help="how often it calls the inverse operation's tool (add<->sub, mul<->div); the rest is split evenly"
    )


def episode_messages(problem: Problem, tool: str) -> list[dict[str, Any]]:
    """The chat of one episode in which the model calls `tool` (right or wrong) on the numbers."""
    arguments = {"a": problem.a, "b": problem.b}
    result = call_tool(tool, arguments)
    call = {"id": "call_0", "type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}
    return [
        {"role": "user", "content": problem.question},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": format_tool_result(result)},
        {"role": "assistant", "content": format_answer(result)},
    ]


def render_with_mask(
    tokenizer, messages: list[dict[str, Any]], tools: list | None = TOOLS
) -> tuple[list[int], list[int]]:
    """Token ids of the chat and a mask that is 1 on the assistant's own tokens.

    Each message is rendered as the text it adds to the conversation and tokenized on its own,
    as the router does; the "\\n" after an assistant's <|im_end|> belongs to the next prompt.
    """
    ids: list[int] = []
    mask: list[int] = []
    rendered = ""
    for end, message in enumerate(messages, start=1):
        is_assistant = message["role"] == "assistant"
        text = _render(tokenizer, messages[:end], False, tools)
        if is_assistant:  # the prompt part: everything up to and including "<|im_start|>assistant\n"
            prompt = _render(tokenizer, messages[: end - 1], True, tools)
            ids += _encode(tokenizer, prompt[len(rendered) :])
            mask += [0] * (len(ids) - len(mask))
            generated = text[len(prompt) :].removesuffix("\n")
            ids += _encode(tokenizer, generated)
            mask += [1] * (len(ids) - len(mask))
            rendered = prompt + generated
    return ids, mask


def _render(tokenizer, messages: list[dict[str, Any]], add_generation_prompt: bool, tools: list | None) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


INVERSE = {"add": "sub", "sub": "add", "mul": "div", "div": "mul"}


def teacher_tool(problem: Problem, rng: random.Random, cfg: SFTConfig) -> str:
    """The sloppy teacher's tool for `problem`: right, its inverse, or one of the other two."""
    draw = rng.random()
    if draw < cfg.teacher_right:
        return problem.tool
    if draw < cfg.teacher_right + cfg.teacher_inverse:
        return INVERSE[problem.tool]
    return rng.choice([t for t in TOOL_NAMES if t not in (problem.tool, INVERSE[problem.tool])])


def make_batch(tokenizer, problems: list[Problem], rng: random.Random, tools: list | None, cfg: SFTConfig):
    """(input_ids, labels, attention_mask) for one step of the demo's transcripts."""
    return collate(
        tokenizer,
        [render_with_mask(tokenizer, episode_messages(p, teacher_tool(p, rng, cfg)), tools) for p in problems],
    )


def collate(tokenizer, rows: list[tuple[list[int], list[int]]]):
    """(input_ids, labels, attention_mask) of (ids, mask) rows, right-padded; labels only where mask is 1."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((len(rows), width), pad)
    labels = torch.full((len(rows), width), -100)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, mask) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(ids)] = torch.tensor([t if m else -100 for t, m in zip(ids, mask, strict=True)])
        attention[i, : len(ids)] = 1
    return input_ids, labels, attention


# one step's batch: (tokenizer, step from 1) -> ((input_ids, labels, attention_mask), what it holds, for the log)
BatchFn = Callable[[Any, int], tuple[tuple[Any, Any, Any], str]]


def fine_tune(model_dir: Path, out_dir: Path, cfg: FineTuneConfig, total: int, batch: BatchFn) -> Path:
    """Fine-tune the HF model in `model_dir` for `total` steps on `batch`'s transcripts; save it to `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, get_cosine_schedule_with_warmup

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    schedule = get_cosine_schedule_with_warmup(optimizer, cfg.warmup_steps, total)
    model.train()
    start = time.monotonic()
    for step in range(1, total + 1):
        (input_ids, labels, attention), kind = batch(tokenizer, step)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 25 == 0 or step == total:
            print(
                f"[warm-start sft] step {step}/{total} ({kind}) loss {loss.item():.4f} {time.monotonic() - start:.0f}s"
            )
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def is_short_step(step: int, short_steps: int) -> bool:
    """Whether warm-start step `step` (from 1) trains on short transcripts: all of phase 1, then every
    other step of phase 2. The full ones teach the copying to look past the long prompt (the tools
    block), the short ones keep it from being unlearned meanwhile."""
    return step <= short_steps or (step - short_steps) % 2 == 0


def sft(model_dir: Path, out_dir: Path, cfg: SFTConfig, task: TaskConfig) -> Path:
    """Fine-tune the HF model in `model_dir` on the sloppy teacher's transcripts and save it to `out_dir`."""
    train, _ = make_splits(task)  # never trains on eval problems, even for the format
    rng = random.Random(cfg.seed)

    def batch(tokenizer, step: int):
        short = is_short_step(step, cfg.short_steps)
        size, tools = (cfg.short_batch_size, None) if short else (cfg.batch_size, TOOLS)
        problems = [rng.choice(train) for _ in range(size)]
        return make_batch(tokenizer, problems, rng, tools, cfg), "short" if short else "full"

    return fine_tune(model_dir, out_dir, cfg, cfg.short_steps + cfg.steps, batch)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Warm-start SFT on tool-call format (random tool choice).")
    parser.add_argument("model_dir", type=Path, help="Hugging Face model to start from")
    parser.add_argument("out_dir", type=Path, help="where to save the warm-started model")
    add_dataclass_args(parser, SFTConfig, "sft")
    add_dataclass_args(parser, TaskConfig, "task")
    args = parser.parse_args(argv)
    out = sft(args.model_dir, args.out_dir, from_namespace(SFTConfig, args), from_namespace(TaskConfig, args))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
