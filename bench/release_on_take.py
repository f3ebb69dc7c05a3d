"""Prototype of a proposed fix, for measurement only: `slimeish train` whose async producer gets
a slot back as soon as the trainer takes a group, not once the whole batch is assembled.

`slimeish.train.collect_groups` calls `producer.release(len(groups))` after it has collected all
`rollout_batch_size` groups, so a group already taken keeps its producer slot while the trainer
waits for the batch's slowest group. This runs the real `slimeish.train.main` with that one
function replaced (release per take), so `bench/async_speedup.py --prototype release-on-take`
can show what the fix would buy. The lead owns slimeish/train.py; this module is not a fix.
Run: .venv/bin/python -m bench.release_on_take <slimeish train flags>
"""

from __future__ import annotations

import asyncio
import sys

from buffer.client import Buffer
from buffer.records import Group
from slimeish import train
from slimeish.producer import RolloutProducer


async def collect_groups(buffer: Buffer, producer: RolloutProducer, n: int, version: int, mode: str) -> list[Group]:
    """`train.collect_groups` with one change: `release` right after each take."""
    groups: list[Group] = []
    while len(groups) < n:
        taken = await buffer.take_groups(n - len(groups), train.CONSUMER, version)
        groups += taken
        if taken:
            producer.release(len(taken))
            continue
        if mode == "sync":
            await producer.run_once()
        else:
            await asyncio.sleep(0.05)
    return groups


if __name__ == "__main__":
    train.collect_groups = collect_groups
    train.main(sys.argv[1:])
