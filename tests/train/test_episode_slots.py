"""`--rollout-concurrency` bounds episodes across rollout calls that run in different threads."""

import asyncio
import threading
from types import SimpleNamespace

import pytest

from slimeish.rollout.run_state import EpisodeSlots, RolloutRun, rollout_run


def test_slots_bound_episodes_across_threads_and_loops():
    slots, lock = EpisodeSlots(3), threading.Lock()
    running, peak, done = [0], [0], [0]

    async def episode() -> None:
        async with slots:
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            await asyncio.sleep(0.01)
            with lock:
                running[0] -= 1
                done[0] += 1

    async def rollout_call() -> None:  # one producer worker: its own thread and event loop
        await asyncio.gather(*(episode() for _ in range(8)))

    threads = [threading.Thread(target=asyncio.run, args=(rollout_call(),)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert done[0] == 24 and peak[0] == 3


def test_a_cancelled_waiter_does_not_keep_a_slot():
    async def main() -> None:
        slots = EpisodeSlots(1)
        await slots.__aenter__()
        waiter = asyncio.create_task(slots.__aenter__())
        await asyncio.sleep(0)
        waiter.cancel()  # gives up while queued
        await asyncio.gather(waiter, return_exceptions=True)
        picked = asyncio.create_task(slots.__aenter__())
        await asyncio.sleep(0)
        slots.release()  # hands the slot to `picked` ...
        picked.cancel()  # ... which gives up before the hand-over runs: the slot must stay free
        await asyncio.gather(picked, return_exceptions=True)
        await asyncio.wait_for(slots.__aenter__(), timeout=1)

    asyncio.run(main())


def test_one_set_of_slots_per_limit_in_a_run_and_none_shared_between_runs():
    run, other = RolloutRun(), RolloutRun()
    assert run.episode_slots(5) is run.episode_slots(5) and run.episode_slots(5) is not run.episode_slots(6)
    assert other.episode_slots(5) is not run.episode_slots(5)


def test_a_rollout_call_finds_its_run_in_args_or_is_a_run_of_its_own():
    run = RolloutRun()
    assert rollout_run(SimpleNamespace(rollout_run=run)) is run
    assert rollout_run(SimpleNamespace()) is not rollout_run(SimpleNamespace())
    with pytest.raises(TypeError, match="RolloutRun"):
        rollout_run(SimpleNamespace(rollout_run="not a run"))


def test_rollout_calls_of_a_run_take_turns_at_the_first_router():
    run = RolloutRun()
    assert [run.first_router(3) for _ in range(4)] == [0, 1, 2, 0]
