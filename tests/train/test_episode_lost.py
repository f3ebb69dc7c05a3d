"""An episode lost to its infrastructure is generated again in its place, against a real router,
engine and buffer.

The fake episode functions here stand in for the Ray-task episodes of `agent_command` and
`openai_agent` (`RayWorkers.run`), which raise `EpisodeLost` when the node or worker running the
agent dies: each takes a real turn through its session, then raises `EpisodeLost` where a node
death would have.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.common.procs import free_port
from slimeish.common.sample import Sample
from slimeish.rollout import RolloutConfig
from slimeish.rollout_functions.sessions import (
    EPISODE_ATTEMPTS,
    REGENERATED,
    EpisodeLost,
    Session,
    http_client,
    rollout_output,
    run_groups,
)
from slimeish.router.config import RouterConfig
from slimeish.router.server import create_app
from tests.router.conftest import ADMIN_TOKEN, start_engine
from tests.stand_in import serve_app

Status = Sample.Status
GROUP = "g0"  # the buffer group of group_index 0


@pytest.fixture(scope="module")
def engine_url(tiny_model, tmp_path_factory) -> Iterator[str]:
    proc, url = start_engine(tiny_model, tmp_path_factory.mktemp("engine"))
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def valkey(tmp_path_factory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("valkey")) as server:
        yield server


class Stack:
    """A router on the buffer under a run of its own, which the test can restart (`restart`)."""

    def __init__(self, tiny_model, engine_url: str, valkey: EmbeddedServer):
        self.run_id, self.port = f"lost-{uuid.uuid4().hex[:8]}", free_port()
        self.url, self.buffer_url = f"http://127.0.0.1:{self.port}", valkey.url
        self.config = RouterConfig(
            model=tiny_model,
            engine=[engine_url],
            buffer_url=valkey.url,
            run_id=self.run_id,
            admin_token=ADMIN_TOKEN,
            router_id="router0",
        )
        self._serving = contextlib.ExitStack()
        self._serving.enter_context(serve_app(create_app(self.config), self.port, startup_timeout=30))

    def restart(self) -> None:
        """Stop the router, and start it again on its port as `slimeish train` would (recovering its sessions)."""
        self._serving.close()
        config = dataclasses.replace(self.config, recover_open_sessions=True)
        self._serving.enter_context(serve_app(create_app(config), self.port, startup_timeout=30))

    def args(self) -> SimpleNamespace:
        cfg = RolloutConfig(rollout_max_response_len=2, n_samples_per_prompt=2, router_retry_s=10.0)
        return SimpleNamespace(**dataclasses.asdict(cfg), router_url=self.url, admin_token=ADMIN_TOKEN)

    def buffer(self) -> Buffer:
        return Buffer(self.buffer_url, self.run_id)


@pytest.fixture
def stack(tiny_model, engine_url, valkey) -> Iterator[Stack]:
    s = Stack(tiny_model, engine_url, valkey)
    yield s
    s._serving.close()


def lost_on(lost: dict[int, int], on_loss=None):
    """An episode (`RayWorkers.run`'s stand-in) that takes one turn, then is lost `lost[index]`
    times for the sample at that index before it completes; it records every session it ran in."""
    ran: dict[int, list[str]] = {}

    async def episode(session: Session, sample: Sample) -> Sample:
        index = sample.index
        assert index is not None
        ran.setdefault(index, []).append(session.session_id)
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        (await http_client().post(session.base_url + "/chat/completions", json=chat)).raise_for_status()
        if len(ran[index]) <= lost.get(index, 0):
            if on_loss is not None:
                on_loss()
            raise EpisodeLost("NodeDiedError: the node running the agent died")
        sample.reward, sample.status = 1.0, Status.COMPLETED
        return sample

    return episode, ran


def run(stack: Stack, episode: Any) -> list[Sample]:
    groups = [[Sample(group_index=0, index=i, prompt="hi") for i in range(2)]]
    (group,) = asyncio.run(run_groups(stack.args(), groups, episode, rollout_id=0, evaluation=False))
    return group


async def statuses(stack: Stack, session_ids: list[str]) -> list[tuple[str, bool]]:
    async with stack.buffer() as buf:
        views = await buf.sessions(session_ids)
    return [(views[sid].status, views[sid].retired) for sid in session_ids]


async def test_a_lost_episode_is_generated_again_in_its_place_and_the_group_trains(stack, caplog):
    episode, ran = lost_on({0: 1})
    with caplog.at_level(logging.WARNING, logger="slimeish.rollout_functions.sessions"):
        samples = await asyncio.to_thread(run, stack, episode)

    assert [s.status for s in samples] == [Status.COMPLETED, Status.COMPLETED]
    lost, again = ran[0]
    assert samples[0].session_id == again and samples[0].metadata[REGENERATED] == 1
    assert rollout_output([samples], evaluation=False).metrics["regenerated"] == 1.0
    regenerations = [r for r in caplog.records if "generating it again" in r.getMessage()]
    assert len(regenerations) == 1 and "attempt 2 of 3" in regenerations[0].getMessage()
    assert await statuses(stack, [lost]) == [("aborted", True)]  # stored, never trained on
    async with stack.buffer() as buf:
        (group,) = (await buf.take_groups(1, "t", current_version=0)).groups
        assert [(s.index, s.session_id, s.reward) for s in group.samples] == [(0, again, 1.0), (1, ran[1][0], 1.0)]
        counters = await buf.counters()
    assert counters.get("groups_dropped_failed", 0) == 0 and counters["sessions_open"] == 0


async def test_an_episode_lost_every_time_fails_after_the_last_attempt(stack):
    episode, ran = lost_on({0: EPISODE_ATTEMPTS})
    samples = await asyncio.to_thread(run, stack, episode)

    assert samples[0].status == Status.FAILED
    assert samples[0].metadata["error"].startswith("EpisodeLost: NodeDiedError")
    assert samples[0].metadata["error"].endswith(f"(lost {EPISODE_ATTEMPTS} times)")
    assert len(ran[0]) == EPISODE_ATTEMPTS
    *aborted, last = ran[0]
    assert await statuses(stack, aborted) == [("aborted", True)] * (EPISODE_ATTEMPTS - 1)
    assert await statuses(stack, [last]) == [("failed", False)]  # the group policy decides, as for any failure
    async with stack.buffer() as buf:
        assert (await buf.take_groups(1, "t", current_version=0)).groups == []
        assert (await buf.counters())["groups_dropped_failed"] == 1


async def test_a_lost_episode_whose_router_restarted_is_left_to_the_routers_recovery(stack):
    # The router restarts while the episodes run: its recovery closes their open sessions and
    # queues their places, so the abort answers 404 and the rollout side leaves the place to that
    # queue, as a finish answered 404 does (the sibling's, still open at the restart).
    episode, ran = lost_on({0: 1}, on_loss=stack.restart)
    samples = await asyncio.to_thread(run, stack, episode)

    assert len(ran[0]) == 1 and samples[0].status == Status.FAILED
    assert "closed by a router restart" in samples[0].metadata["error"]
    async with stack.buffer() as buf:
        (request,) = await buf.pop_regenerate(10)
        assert (request.group_id, request.indices) == (GROUP, [0, 1])
    assert await statuses(stack, [ran[0][0], ran[1][0]]) == [("aborted", True)] * 2
