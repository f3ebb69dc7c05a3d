"""Real child processes for the crash tests: a trainer-like consumer and a router-like writer.

python buffer_procs.py consume URL RUN_ID N OUT   take N groups, ack the first, record ids, hang
python buffer_procs.py write URL RUN_ID PREFIX N_GROUPS SIZE INDICES OUT
                                                write sessions INDICES (comma-separated) of N_GROUPS
                                                groups, each write sent twice (a retried request),
                                                and record each session once its finish is acknowledged
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from slimeish.buffer import Buffer, SessionInfo, Turn
from slimeish.common.files import replace_json


async def consume(url: str, run_id: str, n: int, out: str) -> None:
    async with Buffer(url, run_id) as buf:
        groups = (await buf.take_groups(n, "trainer-0")).groups
        await buf.ack([groups[0].group_id])
        # whole or not at all: the test reads the file as soon as it exists, then kills us
        replace_json(Path(out), {"acked": groups[0].group_id, "held": [g.group_id for g in groups[1:]]})
        await asyncio.sleep(3600)  # "training" until SIGKILL


async def write_session(buf: Buffer, gid: str, index: int, size: int, log) -> None:
    sid = f"{gid}-{index}"
    info = SessionInfo(sid, gid, index, size, {"prompt": gid})
    turns = [
        Turn(sid, 0, 0, None, [1, 2, 3, index], [4, 5, 6], [-0.1, -0.2, -0.3], [1]),
        Turn(sid, 1, 0, None, [7, 8], [9], [-0.4], [2]),
    ]
    for _ in range(2):  # every write twice, as a router retrying after a timeout would
        await buf.open_session(info)
    for turn in turns:
        for _ in range(2):
            await buf.append_turn(turn)
    for _ in range(2):
        await buf.finish_session(sid, float(index), "completed")
    log.write(sid + "\n")
    log.flush()


async def write(url: str, run_id: str, prefix: str, n_groups: int, size: int, indices: str, out: str) -> None:
    async with Buffer(url, run_id) as buf:
        with open(out, "a") as log:
            wanted = [int(i) for i in indices.split(",")]
            for start in range(0, n_groups, 8):  # 8 groups at a time, all their sessions concurrently
                batch = range(start, min(start + 8, n_groups))
                await asyncio.gather(*(write_session(buf, f"{prefix}{g}", i, size, log) for g in batch for i in wanted))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "consume":
        asyncio.run(consume(args[0], args[1], int(args[2]), args[3]))
    else:
        asyncio.run(write(args[0], args[1], args[2], int(args[3]), int(args[4]), args[5], args[6]))
