"""Viewer load time over a run of 10,000 samples: the step list and the sample page.

    .venv/bin/python -m bench.viewer_load [--samples 10000] [--group-size 8] [--groups-per-step 10] [--tokens 2048]

Fills an embedded buffer through the Buffer API as the router does (open, two turns, finish),
writes `trained_groups.jsonl` and `metrics.jsonl` as `slimeish train` does, serves the viewer,
then measures (median of --repeat) the JSON each page is drawn from over HTTP, and the whole page
in headless chromium (navigation until the page is drawn: HTML, scripts, API calls, DOM, SVG).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from slimeish.buffer import Buffer, EmbeddedServer, SessionInfo, Turn
from slimeish.viewer import ViewerConfig, create_app
from slimeish.viewer.catalog import Catalog
from tests.stand_in import serve_app

RUN = "bench-run"


def turns(sid: str, tokens: int, rng: random.Random) -> list[Turn]:
    """Two turns: a prompt and a reply, then a tool result and a reply (a quarter prompt)."""
    half, out = tokens // 2, tokens * 3 // 8
    return [
        Turn(sid, t, 0, None, [rng.randrange(150_000) for _ in range(half - out)],
             [rng.randrange(150_000) for _ in range(out)], [-rng.random() * 3 for _ in range(out)], [t],
             engine="bench", finish_reason="stop")
        for t in range(2)
    ]  # fmt: skip


async def fill(url: str, n: int, group_size: int, tokens: int) -> list[str]:
    rng = random.Random(0)
    async with Buffer(url, RUN) as buf:

        async def one(i: int) -> str:
            sid = f"s{i}"
            await buf.open_session(SessionInfo(sid, f"g{i // group_size}", i % group_size, group_size))
            for turn in turns(sid, tokens, rng):
                await buf.append_turn(turn)
            await buf.finish_session(sid, reward=float(rng.random() < 0.5))
            return sid

        sids = []
        for start in range(0, n, 50):
            sids += await asyncio.gather(*(one(i) for i in range(start, min(n, start + 50))))
    return sids


def write_run_dir(run_dir: Path, groups: int, per_step: int) -> int:
    run_dir.mkdir(parents=True)
    steps = groups // per_step
    with (run_dir / "trained_groups.jsonl").open("w") as ledger, (run_dir / "metrics.jsonl").open("w") as metrics:
        for step in range(steps):
            ids = [f"g{g}" for g in range(step * per_step, (step + 1) * per_step)]
            ledger.write(json.dumps({"step": step, "groups": ids}) + "\n")
            row = {"step": step, "rollout/reward_mean": 0.5, "rollout/response_length": 1536.0, "time/rollout": 3.0}
            metrics.write(json.dumps(row) + "\n")
    return steps


def median_s(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(url: str, pages: dict[str, tuple[str, str]], repeat: int) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        for name, (api, _) in pages.items():
            size = len(client.get(api).raise_for_status().content)
            ms = median_s(lambda api=api: client.get(api).raise_for_status(), repeat) * 1000
            print(f"{name:<12} API  {ms:7.1f} ms  ({size / 1e6:.2f} MB JSON)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = browser.new_page()
        for name, (_, route) in pages.items():

            def load(route: str = route) -> None:
                page.goto("about:blank")
                page.goto(f"{url}/{route}")
                page.wait_for_selector(f"main[data-ready='{route}']")

            print(f"{name:<12} page {median_s(load, repeat) * 1000:7.1f} ms (chromium, load until drawn)")
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per sample")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedServer(Path(tmp) / "buffer") as valkey:
        t0 = time.perf_counter()
        sids = asyncio.run(fill(valkey.url, args.samples, args.group_size, args.tokens))
        steps = write_run_dir(Path(tmp) / RUN, args.samples // args.group_size, args.groups_per_step)
        print(f"{len(sids)} samples x {args.tokens} tokens, {steps} steps: filled in {time.perf_counter() - t0:.0f}s; "
              f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")  # fmt: skip
        catalog = Catalog({RUN: Path(tmp) / RUN}, {}, valkey.url)
        with serve_app(create_app(ViewerConfig(run_dir=Path(tmp) / RUN), catalog), startup_timeout=30) as url:
            step = steps // 2
            measure(url, {
                "step list": (f"/api/runs/{RUN}/steps", f"#/run/{RUN}"),
                "step page": (f"/api/runs/{RUN}/steps/{step}", f"#/run/{RUN}/step/{step}"),
                "sample page": (f"/api/runs/{RUN}/samples/{sids[len(sids) // 2]}/0",
                                f"#/run/{RUN}/sample/{sids[len(sids) // 2]}/0"),
            }, args.repeat)  # fmt: skip


if __name__ == "__main__":
    main()
