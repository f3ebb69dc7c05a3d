"""Where the loop's batches come from: trainable groups out of the buffer, and evaluations."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from slimeish.buffer import Buffer, TakeResult
from slimeish.data import DataSource
from slimeish.train.metrics import prefixed
from slimeish.train.producer import RolloutProducer, eval_output
from slimeish.train.slime_hooks import SlimeHooks

# The trainer's consumer name in the buffer: a restarted trainer gets its unacknowledged groups back.
CONSUMER = "trainer"
# Sync mode gives up after this many rollout batches in a row yield no trainable group.
MAX_EMPTY_BATCHES = 5


async def collect_groups(buffer: Buffer, producer: RolloutProducer, n: int, version: int, mode: str) -> TakeResult:
    """`n` trainable groups, and what the takes settled without handing out, summed. Whatever is
    ready is taken first (groups re-delivered after a crash); only then does sync mode generate the
    groups still missing (exactly those, so no surplus is left to be trained a version later), and
    async mode wait for the producer. Async slots are freed for taken, dropped and reopened groups
    alike."""
    takes: list[TakeResult] = []
    empty_batches = 0
    while (missing := n - sum(len(t.groups) for t in takes)) > 0:
        producer.raise_if_failed()
        take = await buffer.take_groups(missing, CONSUMER, version)
        producer.release(take.settled)
        takes.append(take)
        if take.groups:
            empty_batches = 0
            continue
        if mode == "async":
            await asyncio.sleep(0.05)
            continue
        if empty_batches == MAX_EMPTY_BATCHES:
            raise RuntimeError(
                f"{MAX_EMPTY_BATCHES} rollout batches in a row gave no trainable group: every group failed or was "
                "filtered (see episodes/failed in metrics.jsonl, `slimeish buffer stats`, the reward function)"
            )
        await producer.run_once(missing)
        empty_batches += 1
    return _summed(takes)


def _summed(takes: list[TakeResult]) -> TakeResult:
    counts = {
        f.name: sum(getattr(t, f.name) for t in takes) for f in dataclasses.fields(TakeResult) if f.name != "groups"
    }
    return TakeResult(**counts | {"groups": [g for t in takes for g in t.groups]})


async def evaluate(
    rollout_fn: Callable[..., Any], args: Any, eval_data: DataSource | None, step: int, hooks: SlimeHooks
) -> dict[str, float]:
    """One pass over the eval prompts (from the first, every time) by --eval-function-path, else the
    rollout function: the mean reward, and the function's own eval metrics."""
    if eval_data is None:
        return {}
    eval_data.load_state({"epoch": 0, "offset": 0, "next_group_index": 0})
    out = eval_output(await asyncio.to_thread(hooks.eval_fn or rollout_fn, args, step, eval_data, True))
    rewards = [r for d in out.data.values() for r in d["rewards"]]
    metrics = {"eval/reward_mean": sum(rewards) / max(len(rewards), 1)} | prefixed("eval", out.metrics)
    return hooks.log_eval(step, args, out.data, out.metrics, metrics)
