"""The agent of `bench/async_speedup.py`: one real chat turn plus a heavy-tailed wait that is not CPU work.

Most episodes wait `base` seconds; a `tail_prob` fraction wait `tail_factor * base` (a slow tool,
a long test run). The draw is seeded by (seed, group index, sample index), so sync and async runs
see the same episodes. The reward is a seeded uniform number: it varies inside every group, so
GRPO advantages are non-zero and the trainer does real work.

`slimeish train` loads `run` by import path and gives it only (client, sample), so the settings
come from the environment the bench sets for the run:
  BENCH_BASE_DELAY (s), BENCH_TAIL_FACTOR, BENCH_TAIL_PROB, BENCH_SEED, BENCH_MAX_TOKENS,
  BENCH_CHAT_AT ("end": wait, then the chat turn; "start": chat turn, then wait),
  BENCH_EPISODE_LOG (a JSONL path; one line per episode with its timing, for the bench's analysis).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from typing import Any

import openai


def episode_delay(seed: int, group_index: int, index: int, base: float, factor: float, prob: float) -> float:
    """The seeded wait of one episode: `base`, or `factor * base` with probability `prob`."""
    rng = random.Random(f"{seed}:{group_index}:{index}")
    return base * factor if rng.random() < prob else base


async def run(client: openai.AsyncOpenAI, sample: Any) -> float:
    env = os.environ
    seed = int(env.get("BENCH_SEED", "0"))
    delay = episode_delay(
        seed,
        sample.group_index,
        sample.index,
        float(env.get("BENCH_BASE_DELAY", "0.25")),
        float(env.get("BENCH_TAIL_FACTOR", "20")),
        float(env.get("BENCH_TAIL_PROB", "0.1")),
    )
    chat_at_end = env.get("BENCH_CHAT_AT", "end") == "end"
    start = time.time()
    if chat_at_end:
        await asyncio.sleep(delay)
    t_chat = time.time()
    await client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": str(sample.prompt)}],
        max_tokens=int(env.get("BENCH_MAX_TOKENS", "4")),
    )
    chat_s = time.time() - t_chat
    if not chat_at_end:
        await asyncio.sleep(delay)
    end = time.time()
    if path := env.get("BENCH_EPISODE_LOG"):
        row = {"group": sample.group_index, "index": sample.index, "delay": delay, "chat_s": chat_s}
        with open(path, "a") as f:  # one short line per write: appends from threads do not interleave
            f.write(json.dumps(row | {"start": start, "end": end}) + "\n")
    return random.Random(f"reward:{seed}:{sample.group_index}:{sample.index}").random()
