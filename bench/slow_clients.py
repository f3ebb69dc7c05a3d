"""Slow clients against a real router: other sessions' turn latency, and how soon the router
closes the slow connections.

A real `slimeish engine` (the tiny model) behind a real `slimeish router`. A client runs chat
turns on `--sessions` sessions at once, first alone (the baseline), then while another process
attacks the router for `--seconds`: `--idle` connections that send nothing and `--trickle`
connections that send a request a byte every `--every` seconds (half trickle the head, half a
body after a complete head). A connection the router closes is opened again at once, so the
attack holds its numbers for the whole time. Reported: the turns' p50/p99 and the added p99; for
each kind of slow connection, how many the router closed and the longest any stayed open.
Flags after `--` go to the router (e.g. `-- --header-timeout 1000 --body-timeout 1000
--max-connections 0` to approximate a router without the deadlines and caps).
Run by hand:  .venv/bin/python bench/slow_clients.py [--idle 1000 --trickle 100 --seconds 30] [-- ROUTER FLAGS]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

from slimeish.common.procs import ManagedProcess, free_port, wait_http
from slimeish.models.tiny import make_tiny_model

HEAD = "POST /sessions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"


# -- the attack (its own process: its 1,100 sockets must not share the measuring client's loop) --
async def slow_connection(host: str, port: int, kind: str, every: float, until: float, opened: list[float]) -> None:
    """One slow connection after another until `until`; the seconds each stayed open until the router closed it."""
    trickled = {"idle": b"", "head": HEAD.encode(), "body": b" " * 100_000}[kind]
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(every)
            continue
        if kind == "body":
            writer.write(HEAD.encode())
        closed = asyncio.ensure_future(reader.read())  # done (b"", the router's answer, a reset) once it closes
        sent = 0
        while time.monotonic() < until and not closed.done():
            if sent < len(trickled):
                writer.write(trickled[sent : sent + 1])
                sent += 1
            await asyncio.wait([closed], timeout=every)
        if closed.done():
            closed.exception()  # a reset is a close too
            opened.append(time.monotonic() - started)
        else:
            closed.cancel()
        writer.close()


async def attack(url: str, idle: int, trickle: int, every: float, seconds: float) -> dict[str, object]:
    host, port = url.removeprefix("http://").split(":")
    until = time.monotonic() + seconds
    kinds = {"idle": idle, "head": trickle // 2, "body": trickle - trickle // 2}
    closed: dict[str, list[float]] = {kind: [] for kind in kinds}
    await asyncio.gather(*(slow_connection(host, int(port), kind, every, until, closed[kind])
                           for kind, n in kinds.items() for _ in range(n)))  # fmt: skip
    return {
        kind: {"connections": kinds[kind], "closed_by_router": len(times), "longest_open_s": max(times, default=None)}
        for kind, times in closed.items()
    }


# -- the measured client ------------------------------------------------------------------------
async def turns(router: str, sessions: int, seconds: float) -> list[float]:
    """Latencies (s) of chat turns run on `sessions` sessions at once for `seconds`."""
    latencies: list[float] = []
    until = time.monotonic() + seconds
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:

        async def session() -> None:
            async with client.post(router + "/sessions", json={}) as r:
                base = (await r.json())["base_url"]
            messages = [{"role": "user", "content": "hi"}]
            while time.monotonic() < until:
                started = time.monotonic()
                body = {"model": "m", "messages": messages[-9:], "max_tokens": 8}
                async with client.post(base + "/chat/completions", json=body) as r:
                    reply = await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"a turn answered {r.status}: {reply[:300]!r}")
                latencies.append(time.monotonic() - started)
                messages += [orjson.loads(reply)["choices"][0]["message"], {"role": "user", "content": "go on"}]

        await asyncio.gather(*(session() for _ in range(sessions)))
    return latencies


def percentiles(latencies: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(latencies, n=100)
    return cuts[49], cuts[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attack", help=argparse.SUPPRESS)  # the attacking process: the router's URL
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--trickle", type=int, default=100)
    parser.add_argument("--every", type=float, default=0.5, help="seconds between a trickling client's bytes")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the baseline and of the attack")
    parser.add_argument("--sessions", type=int, default=4, help="sessions the measured client runs at once")
    args, router_flags = parser.parse_known_args()
    router_flags = [f for f in router_flags if f != "--"]
    if args.attack:
        print(json.dumps(asyncio.run(attack(args.attack, args.idle, args.trickle, args.every, args.seconds))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "model")
        engine_port, router_port = free_port(), free_port()
        engine, router = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{router_port}"
        slimeish = [sys.executable, "-m", "slimeish"]
        with ManagedProcess([*slimeish, "engine", "--model", str(model), "--port", str(engine_port)],
                            log_path=Path(tmp) / "engine.log") as e:  # fmt: skip
            wait_http(engine + "/health", timeout=300, proc=e.proc)
            argv = [*slimeish, "router", "--model", str(model), "--engine", engine, "--port", str(router_port)]
            with ManagedProcess([*argv, *router_flags], log_path=Path(tmp) / "router.log") as r:
                wait_http(router + "/health", timeout=300, proc=r.proc)
                asyncio.run(turns(router, args.sessions, 3))  # warm-up
                alone = asyncio.run(turns(router, args.sessions, args.seconds))
                attacker = subprocess.Popen(
                    [sys.executable, __file__, "--attack", router, "--idle", str(args.idle), "--trickle",
                     str(args.trickle), "--every", str(args.every), "--seconds", str(args.seconds + 2)],
                    stdout=subprocess.PIPE,
                )  # fmt: skip
                time.sleep(2)  # its connections open
                attacked = asyncio.run(turns(router, args.sessions, args.seconds))
                slow = json.loads(attacker.communicate(timeout=120)[0])
    (p50, p99), (a50, a99) = percentiles(alone), percentiles(attacked)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"router flags: {' '.join(router_flags) or '(defaults)'}")
    print(f"turns alone:    {len(alone)} turns, p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms")
    print(f"turns attacked: {len(attacked)} turns, p50 {a50 * 1000:.0f} ms, p99 {a99 * 1000:.0f} ms "
          f"(p99 added {(a99 - p99) * 1000:+.0f} ms)")  # fmt: skip
    for kind, seen in slow.items():
        print(f"{kind}: {seen}")


if __name__ == "__main__":
    main()
