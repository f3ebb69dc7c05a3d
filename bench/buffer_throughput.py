"""Buffer throughput: samples/s written and taken, beside the raw ceiling of the same server.

    .venv/bin/python -m bench.buffer_throughput [--tokens 1024 8192] [--samples 2000] [--appendfsync always]

Write path per sample (one session of one turn, as the router does it): open_session,
append_turn, finish_session (which seals the sample), `--concurrency` sessions in flight.
Take path: take_groups + ack of groups of `--group-size`, decoding every sample to lists.
Raw ceiling: pipelined SET / GET of byte strings as large as one stored sample, from the same
client on the same embedded server (same fsync policy); and the same with the CPU work no
buffer can skip (lists -> checked packed bytes before SET; bytes -> Sample lists after GET).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import tempfile
import time

from slimeish.buffer import Buffer, EmbeddedServer, SessionInfo, Turn
from slimeish.buffer.codec import decode_turn, encode_turn
from slimeish.buffer.segments import build_samples
from slimeish.common.sample import Sample


def make_turn(sid: str, tokens: int, rng: random.Random) -> Turn:
    prompt = tokens // 4  # a quarter prompt, three quarters sampled response with log-probs
    out = tokens - prompt
    return Turn(
        sid, 0, 0, None, [rng.randrange(150_000) for _ in range(prompt)], [rng.randrange(150_000) for _ in range(out)],
        [-rng.random() * 5 for _ in range(out)], [3], engine="bench", finish_reason="stop",
    )  # fmt: skip


async def write(buf: Buffer, turns: list[Turn], group_size: int, concurrency: int) -> float:
    async def one(i: int, turn: Turn) -> None:
        await buf.open_session(SessionInfo(turn.session_id, f"g{i // group_size}", i % group_size, group_size))
        await buf.append_turn(turn)
        await buf.finish_session(turn.session_id, 1.0)

    start = time.perf_counter()
    for lo in range(0, len(turns), concurrency):
        await asyncio.gather(*(one(i, turns[i]) for i in range(lo, min(lo + concurrency, len(turns)))))
    return time.perf_counter() - start


async def take(buf: Buffer, n_groups: int, batch: int) -> tuple[float, int]:
    start, taken = time.perf_counter(), 0
    while taken < n_groups:
        groups = (await buf.take_groups(batch, "bench")).groups
        assert groups, "ran out of groups"
        await buf.ack([g.group_id for g in groups])
        taken += len(groups)
    return time.perf_counter() - start, taken


def seal(turn: Turn) -> bytes:
    """The CPU part of a write: lists -> checked arrays -> the bytes stored for a one-turn sample."""
    return encode_turn(turn.pack())


def unseal(blob: bytes) -> Sample:
    """The CPU part of a read: stored bytes -> a Sample with lists."""
    (sample,) = build_samples([decode_turn(blob)], status="completed", index=0, group_index=0, metadata={})
    return sample.to_sample(1.0)


async def pipelined(redis, commands: list[tuple], pipeline: int) -> list:
    replies = []
    for lo in range(0, len(commands), pipeline):
        pipe = redis.pipeline(transaction=False)
        for command in commands[lo : lo + pipeline]:
            pipe.execute_command(*command)
        replies += await pipe.execute()
    return replies


async def raw(buf: Buffer, turns: list[Turn], pipeline: int) -> dict[str, float]:
    """Ceilings from the same client: pipelined SET/GET of opaque bytes of one sample's size, and
    the same with the unavoidable CPU work around them (encode lists to bytes; decode to lists)."""
    redis, n = buf.redis, len(turns)
    value = random.randbytes(len(seal(turns[0])))
    keys = [f"bench-raw:{i}" for i in range(n)]
    rates, start = {}, time.perf_counter()
    await pipelined(redis, [("SET", key, value) for key in keys], pipeline)
    rates["raw_set"], start = n / (time.perf_counter() - start), time.perf_counter()
    await pipelined(redis, [("GET", key) for key in keys], pipeline)
    rates["raw_get"], start = n / (time.perf_counter() - start), time.perf_counter()
    await pipelined(redis, [("SET", key, seal(turn)) for key, turn in zip(keys, turns, strict=True)], pipeline)
    rates["raw_set_encode"], start = n / (time.perf_counter() - start), time.perf_counter()
    blobs = await pipelined(redis, [("GET", key) for key in keys], pipeline)
    [unseal(blob) for blob in blobs]
    rates["raw_get_decode"] = n / (time.perf_counter() - start)
    await redis.delete(*keys)
    return rates


async def bench(url: str, tokens: int, n: int, args: argparse.Namespace) -> dict:
    rng = random.Random(tokens)
    turns = [make_turn(f"s{i}", tokens, rng) for i in range(n)]
    async with Buffer(url, f"bench{tokens}-{random.randrange(1 << 30)}") as buf:
        write_s = await write(buf, turns, args.group_size, args.concurrency)
        take_s, groups = await take(buf, n // args.group_size, args.take_batch)
        ceilings = await raw(buf, turns, args.pipeline)
    return {
        "sample_bytes": len(seal(turns[0])), "write": n / write_s, "take": groups * args.group_size / take_s,
        **ceilings,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--samples", type=int, default=2000, help="samples per size (1/4 of that for 8k+)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64, help="sessions written at once")
    parser.add_argument("--take-batch", type=int, default=8, help="groups per take_groups call")
    parser.add_argument("--pipeline", type=int, default=64, help="commands per raw pipeline")
    parser.add_argument("--appendfsync", default="always", choices=["always", "everysec", "no"])
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the best rate of each column is kept")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {platform.python_version()}, "
          f"appendfsync={args.appendfsync}")  # fmt: skip
    print(
        "| tokens | sample bytes | written/s | raw SET/s | write % | raw SET+encode/s "
        "| taken/s | raw GET/s | take % | raw GET+decode/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp, EmbeddedServer(tmp, appendfsync=args.appendfsync) as server:
        for tokens in args.tokens:
            n = args.samples if tokens < 4096 else args.samples // 4
            n -= n % args.group_size
            runs = [asyncio.run(bench(server.url, tokens, n, args)) for _ in range(args.repeat)]
            r = {key: max(run[key] for run in runs) for key in runs[0]}  # shared machine: keep the best
            cells = [
                tokens, r["sample_bytes"], r["write"], r["raw_set"], f"{100 * r['write'] / r['raw_set']:.0f} %",
                r["raw_set_encode"], r["take"], r["raw_get"], f"{100 * r['take'] / r['raw_get']:.0f} %",
                r["raw_get_decode"],
            ]  # fmt: skip
            print("| " + " | ".join(c if isinstance(c, str) else f"{c:.0f}" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
