"""A run that starts at step 0 refuses a buffer already holding its run id's groups (a `--fresh`
start, or a restart before the first checkpoint), instead of failing every group it draws as
taken; another run id in the same buffer starts (with a real valkey-server)."""

from __future__ import annotations

import asyncio

import pytest

from slimeish.buffer import Buffer, SessionInfo
from slimeish.train.parts import RunAlreadyInBuffer, refuse_a_used_buffer
from slimeish.train.setup import parse_args


def test_a_step_0_start_refuses_a_buffer_holding_its_groups(valkey, tmp_path):
    async def earlier_start() -> None:
        async with Buffer(valkey.url, "used") as buffer:
            await buffer.open_session(SessionInfo("s0", "g0", 0, 2))
            await buffer.open_session(SessionInfo("s1", "g0", 1, 2))

    asyncio.run(earlier_start())
    argv = ["--prompt-data", "p.jsonl", "--model-path", "m", "--run-dir", str(tmp_path / "used"), "--fresh",
            "--buffer-url", valkey.url]  # fmt: skip
    setup = parse_args(argv)
    with pytest.raises(RunAlreadyInBuffer, match=r"already holds 2 sessions of run 'used'.*--fresh.*drop --fresh"):
        asyncio.run(refuse_a_used_buffer(setup, valkey.url, "used"))
    asyncio.run(refuse_a_used_buffer(setup, valkey.url, "unused"))  # nothing of this run id: it starts
