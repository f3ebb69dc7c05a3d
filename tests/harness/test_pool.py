"""The warm pool: a claim takes a sandbox built before it (setup.sh already run), the pool builds
the next one in the background, each sandbox serves one episode, and what is ready is drained."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from slimeish.rollout_functions.harness.local import LocalProvider, LocalSandbox
from slimeish.rollout_functions.harness.pool import WarmPool
from slimeish.rollout_functions.harness.sandbox import SandboxError
from slimeish.rollout_functions.harness.tasks import load_task

WAIT_S = 300.0  # a bound for a loaded machine, never asserted on


async def until_ready(pool: WarmPool, task, n: int) -> None:
    async with asyncio.timeout(WAIT_S):
        while pool.ready(task) < n:
            await asyncio.sleep(0.05)


def test_a_claim_takes_a_sandbox_built_before_it_and_the_pool_builds_the_next(make_task, tmp_path):
    builds = tmp_path / "builds.log"  # setup.sh writes a line per build (bubblewrap off: a host path)
    task = load_task(make_task("warm", setup_sh=f"echo built >> {builds}; echo ws > made.txt"))
    root = tmp_path / "sandboxes"

    async def scenario():
        pool = WarmPool(LocalProvider(root, "off"), size=2)
        cold = await pool.create(task)  # none ready: built on the spot, and two more start building
        await until_ready(pool, task, 2)
        built_before = builds.read_text().count("built")
        warm = await pool.create(task)
        built_at_claim = builds.read_text().count("built")
        laid_out = (warm.dir / "app" / "made.txt").read_text()
        grader = await pool.create(task, setup=False)  # not pooled: an empty directory
        await until_ready(pool, task, 2)  # the claimed one replaced
        ready_dirs = {p.name for p in root.iterdir()} - {cold.dir.name, warm.dir.name, grader.dir.name}
        await pool.drain()
        left = {p.name for p in root.iterdir()}
        for box in (cold, warm, grader):
            await box.destroy()
        return cold, warm, grader, built_before, built_at_claim, laid_out, ready_dirs, left, pool.ready(task)

    cold, warm, grader, before, at_claim, laid_out, ready_dirs, left, after_drain = asyncio.run(scenario())
    assert isinstance(warm, LocalSandbox) and isinstance(cold, LocalSandbox) and isinstance(grader, LocalSandbox)
    assert before == 3 and at_claim == before  # the claim ran no setup.sh: its sandbox was built already
    assert laid_out == "ws\n"  # its workspace as setup.sh left it
    assert len({cold.dir, warm.dir, grader.dir}) == 3  # one sandbox per episode, never shared
    assert len(ready_dirs) == 2 and not ready_dirs & left and after_drain == 0  # drained: destroyed
    assert builds.read_text().count("built") == 4  # cold, two warm, one replacement; none for the grader


def test_a_failed_warm_build_leaves_the_claim_to_build_its_own(make_task, tmp_path):
    task = load_task(make_task("broken", setup_sh="echo cannot build; exit 7"))

    async def scenario():
        pool = WarmPool(LocalProvider(tmp_path / "sandboxes", "off"), size=1)
        for _ in range(2):  # each claim builds its own and fails as the episode's sandbox_failed
            with pytest.raises(SandboxError, match=r"setup\.sh exited with 7"):
                await pool.create(task)
        return pool.ready(task)

    assert asyncio.run(scenario()) == 0
    assert list((tmp_path / "sandboxes").iterdir()) == []  # nothing half-built is left


def test_a_pool_holds_at_least_one(tmp_path):
    with pytest.raises(ValueError, match="at least one"):
        WarmPool(LocalProvider(tmp_path, "off"), size=0)


def test_filling_ahead_makes_a_tasks_first_claim_warm(make_task, tmp_path):
    builds = tmp_path / "builds.log"
    task = load_task(make_task("ahead", setup_sh=f"echo built >> {builds}"))

    async def scenario():
        pool = WarmPool(LocalProvider(tmp_path / "sandboxes", "off"), size=1)
        pool.fill(task)
        await until_ready(pool, task, 1)
        before = builds.read_text().count("built")
        first = await pool.create(task)
        at_claim = builds.read_text().count("built")
        await first.destroy()
        await until_ready(pool, task, 1)
        await pool.drain()
        return before, at_claim

    assert asyncio.run(scenario()) == (1, 1)  # the first claim ran no setup.sh of its own


EXITING = """
import asyncio, sys
from pathlib import Path
from slimeish.rollout_functions.harness.local import LocalProvider
from slimeish.rollout_functions.harness.pool import WarmPool
from slimeish.rollout_functions.harness.tasks import load_task

async def main():
    pool = WarmPool(LocalProvider(Path(sys.argv[1]), "off"), size=2)
    task = load_task(sys.argv[2])
    pool.fill(task)
    while pool.ready(task) < 2:
        await asyncio.sleep(0.05)
    print("ready", len(list(Path(sys.argv[1]).iterdir())))

asyncio.run(main())
"""


def test_what_is_ready_at_exit_is_destroyed(make_task, tmp_path):
    task = make_task("at-exit", setup_sh="echo ws > made.txt")
    root = tmp_path / "sandboxes"
    done = subprocess.run(
        [sys.executable, "-c", EXITING, str(root), str(task)], capture_output=True, text=True, timeout=WAIT_S
    )
    assert done.returncode == 0 and "ready 2" in done.stdout, done.stderr
    assert "Traceback" not in done.stderr and list(root.iterdir()) == []
