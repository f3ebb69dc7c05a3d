"""A short real run for the viewer to show: an embedded engine on the tiny model, a router
writing through to a real buffer, agents using the `openai` SDK (one puts a `<script>` payload
in its message, one edits its history and sends a tool result, which splits its episode, one
ends its reply inside a tool call, which does not parse, one is left open), then two trainer
steps that take, record and acknowledge the groups and log their metrics as `slimeish train`
does. The viewer is served over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest

from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.common.sample import Sample
from slimeish.rollout_functions.harness.episode import Outcome, OutcomeKind
from slimeish.rollout_functions.harness.rollout import LOST, OUTCOME
from slimeish.router.config import RouterConfig
from slimeish.router.server import create_app as router_app
from slimeish.train.ledger import TrainedGroups
from slimeish.train.metrics import MetricsLogger, batch_metrics
from slimeish.viewer import ViewerConfig, create_app
from slimeish.viewer.catalog import Catalog
from tests.router.conftest import chat_episode, start_engine
from tests.stand_in import serve_app

T = TypeVar("T")
RUN_ID = "viewer-run"
ADMIN = "admin-secret"
PAYLOAD = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'

# What the harness rollout stores with a member's samples (docs/harness.md): the tool episode's,
# an agent past its timeout whose first attempt lost its sandbox
HARNESS_RECORD = {
    OUTCOME: Outcome(
        task="fix-add-bug", kind=OutcomeKind.AGENT_TIMEOUT, reason="killed at the agent timeout (60 s)",
        reward=0.5, agent_exit=-9, agent_output="thinking...", grader_exit=0, grader_output="1 of 2 tests passed",
        patch="--- before/calc.py\n+++ after/calc.py\n-    return a - b\n+    return a + b\n",
        timings={"sandbox_create_s": 0.1, "agent_s": 60.0, "grade_s": 0.4},
    ).record(),
    LOST: [{"task": "fix-add-bug", "kind": "sandbox_failed", "reason": "the sandbox was removed", "timings": {}}],
}  # fmt: skip


@dataclass
class DemoRun:
    model: Path
    run_dir: Path
    buffer_url: str
    router_url: str
    script_session: str  # its first user message is PAYLOAD
    split_session: str  # edited its history and sent a tool result: two segments; a harness record
    malformed_session: str  # its reply's tool call did not parse (malformed)
    open_session: str  # never finished: in flight

    def viewer_config(self, **overrides) -> ViewerConfig:
        fields = {"model": self.model, "run_dir": self.run_dir, "router_url": self.router_url, "admin_token": ADMIN}
        return ViewerConfig(**(fields | overrides))

    def catalog(self) -> Catalog:
        return Catalog({RUN_ID: self.run_dir}, {}, self.buffer_url)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to its end on a fresh loop in another thread: a test thread may be running one
    already (Playwright's sync API does)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def stored_samples(demo_run: DemoRun, session_id: str) -> list[Sample]:
    async def read() -> list[Sample]:
        async with Buffer(demo_run.buffer_url, RUN_ID) as buf:
            return await buf.session_samples(session_id)

    return run_async(read())


class Agents:
    """Opens sessions on the router and plays agents on them through the `openai` SDK."""

    def __init__(self, router_url: str):
        self.url = router_url
        self.admin = {"Authorization": f"Bearer {ADMIN}"}

    def open(self, group_id: str, index: int, size: int) -> dict:
        body = {"group_id": group_id, "index": index, "group_size": size, "metadata": {"prompt": group_id}}
        return httpx.post(f"{self.url}/sessions", json=body, headers=self.admin).raise_for_status().json()

    def finish(self, session: dict, reward: float, metadata: dict | None = None) -> None:
        url = f"{self.url}/sessions/{session['session_id']}/finish"
        body = {"reward": reward, "metadata": metadata or {}}
        httpx.post(url, json=body, headers=self.admin, timeout=60).raise_for_status()

    async def tool_episode(self, base_url: str) -> None:
        """One turn, then a history the router did not write (a tool call it never returned and its
        result): the router splits the episode there."""
        async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as client:
            first = [{"role": "user", "content": "what is the weather?"}]
            await client.chat.completions.create(model="tiny", messages=first, max_tokens=6)
            call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
            edited = [*first, {"role": "assistant", "content": "", "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "c1", "content": "sunny, <b>22C</b>"}]  # fmt: skip
            await client.chat.completions.create(model="tiny", messages=edited, max_tokens=6)

    async def malformed_call_episode(self, base_url: str) -> None:
        """Asks for a call to `weather` (tool_choice forces the call's opening). Greedy, the tiny
        model goes on with `":`, where the agent's stop string ends the reply: a complete reply
        whose call does not parse, which the router records as a `malformed` parse failure."""
        tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
        async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as client:
            await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "weather in Paris?"}], tools=[tool],
                tool_choice={"type": "function", "function": {"name": "weather"}},
                temperature=0, stop=['"', ":"], max_tokens=8,
            )  # fmt: skip


def play(agents: Agents) -> tuple[list[dict], dict]:
    g0 = [agents.open("g0", i, 2) for i in range(2)]
    g1 = [agents.open("g1", i, 2) for i in range(2)]
    run_async(chat_episode(g0[0]["base_url"], [PAYLOAD, "and again"], max_tokens=8))
    run_async(chat_episode(g0[1]["base_url"], ["hello"], max_tokens=8))
    run_async(agents.tool_episode(g1[0]["base_url"]))
    run_async(agents.malformed_call_episode(g1[1]["base_url"]))
    for session, reward in zip(g0 + g1, (1.0, 0.0, 0.5, 1.0), strict=True):
        agents.finish(session, reward, HARNESS_RECORD if session is g1[0] else None)
    in_flight = agents.open("g-open", 0, 1)
    run_async(chat_episode(in_flight["base_url"], ["still going"], max_tokens=4))
    return g0 + g1, in_flight


async def train_steps(buffer_url: str, run_dir: Path) -> None:
    """What `slimeish train` leaves in the run dir: one group per step, recorded and logged."""
    ledger, metrics = TrainedGroups(run_dir / "trained_groups.jsonl", 0), MetricsLogger(run_dir, tensorboard=False)
    async with Buffer(buffer_url, RUN_ID) as buf:
        for step in range(2):
            taken = await buf.take_groups(1, consumer="trainer-0", current_version=0)
            ledger.record(step, taken.groups)
            samples = [s for g in taken.groups for s in g.samples]
            metrics.log(
                step,
                batch_metrics(samples, 0)
                | {"time/rollout": 0.5 + step, "train/loss": 0.1 * step, "train/is_mask_fraction": 0.01 * step},
            )
            await buf.ack([g.group_id for g in taken.groups])


@pytest.fixture(scope="session")
def demo_run(tiny_model, tmp_path_factory) -> Iterator[DemoRun]:
    root = tmp_path_factory.mktemp("viewer")
    run_dir = root / RUN_ID
    engine, engine_url = start_engine(tiny_model, root)
    try:
        with EmbeddedServer(root / "buffer") as valkey:
            config = RouterConfig(model=tiny_model, engine=[engine_url], admin_token=ADMIN,
                                  buffer_url=valkey.url, run_id=RUN_ID)  # fmt: skip
            with serve_app(router_app(config), startup_timeout=30) as router:
                sessions, in_flight = play(Agents(router))
                run_async(train_steps(valkey.url, run_dir))
                ids = [s["session_id"] for s in sessions]
                yield DemoRun(tiny_model, run_dir, valkey.url, router, ids[0], ids[2], ids[3], in_flight["session_id"])
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def viewer(demo_run) -> Iterator[str]:
    """The viewer over the demo run, behind the admin token."""
    with serve_app(create_app(demo_run.viewer_config(), demo_run.catalog()), startup_timeout=30) as url:
        yield url


@pytest.fixture
def api(viewer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=viewer, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30) as client:
        yield client
