"""Small writers shared by the buffer tests ."""

from __future__ import annotations

from slimeish.buffer import Buffer, SessionInfo, Turn


def turn(
    sid: str,
    i: int,
    *,
    seg: int = 0,
    prompt: list[int] | None = None,
    out: list[int] | None = None,
    version: int = 0,
    split_reason: str | None = None,
) -> Turn:
    """A turn with small default arrays: log-prob -0.5 per output token."""
    prompt = [1, 2, 3] if prompt is None else prompt
    out = [4, 5] if out is None else out
    return Turn(
        sid,
        i,
        seg,
        split_reason,
        prompt,
        out,
        [-0.5] * len(out),
        [version],
        engine="e0",
        finish_reason="stop",
        started_at=1.0,
        finished_at=2.0,
    )


async def write_session(
    buf: Buffer,
    gid: str,
    index: int,
    size: int,
    *,
    reward: float | None = 1.0,
    version: int = 0,
    status: str = "completed",
) -> str:
    """Open, append one turn to, and finish session `<gid>-<index>`; returns its id."""
    sid = f"{gid}-{index}"
    await buf.open_session(SessionInfo(sid, gid, index, size, {"prompt": f"p-{gid}"}))
    await buf.append_turn(turn(sid, 0, version=version))
    await buf.finish_session(sid, reward, status)
    return sid


async def write_group(
    buf: Buffer, gid: str, size: int = 2, *, rewards: list[float] | None = None, version: int = 0
) -> list[str]:
    rewards = rewards or [float(i) for i in range(size)]
    return [await write_session(buf, gid, i, size, reward=rewards[i], version=version) for i in range(size)]
