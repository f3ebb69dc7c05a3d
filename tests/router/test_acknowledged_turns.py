"""A turn is stored if and only if its client was told it succeeded, whatever happens to the store.

A real valkey behind a real router is killed (SIGKILL, then started again on its AOF) or frozen
(SIGSTOP, then SIGCONT: its writes land late) at each step of a turn: before a non-streamed or a
streamed turn, and in the middle of a streamed one (after its first event, before the engine's
last chunk). Each dialect is driven by its real SDK. The agent's episode is: a turn, the faulted
turn (tried twice while the store is down), its retry, and one more turn. The buffer must then
hold exactly the turns the agent got, as one segment: the retry extends it like any turn.

The engine is real; for the mid-stream step a stand-in proxy in front of it holds each stream
after its first chunk until the test has faulted the store (an engine that pauses mid-stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import openai
import pytest

from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.router.config import RouterConfig
from slimeish.router.server import create_app
from tests.router.conftest import ADMIN_TOKEN, stream_tampering_proxy
from tests.stand_in import serve_app

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MAX_TOKENS = 6
released = threading.Event()  # the held engine stream goes on once set
released.set()


async def held(rest: list[bytes]) -> AsyncIterator[bytes]:
    while not released.is_set():
        await asyncio.sleep(0.01)
    for event in rest:
        yield event


@pytest.fixture(scope="module")
def valkey(tmp_path_factory) -> Iterator[EmbeddedServer]:
    """A server of this module's own: the tests kill and freeze it."""
    with EmbeddedServer(tmp_path_factory.mktemp("faulted")) as server:
        yield server


@pytest.fixture(scope="module")
def router(tiny_model, engine_url, valkey) -> Iterator[tuple[str, str]]:
    run_id = f"acked-{uuid.uuid4().hex[:8]}"
    with serve_app(stream_tampering_proxy(engine_url, held), startup_timeout=30) as engine:
        config = RouterConfig(
            model=tiny_model,
            engine=[engine],
            buffer_url=valkey.url,
            run_id=run_id,
            admin_token=ADMIN_TOKEN,
            store_timeout=0.5,
        )
        with serve_app(create_app(config), startup_timeout=30) as url:
            yield url, run_id


@dataclass
class Fault:
    """What happens to the store: `down` while the turn runs, `up` once its client has the answer."""

    down: Callable[[EmbeddedServer], None]
    up: Callable[[EmbeddedServer], None]


def _stop(server: EmbeddedServer) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)


def _cont(server: EmbeddedServer) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGCONT)


FAULTS = {
    "killed": Fault(down=EmbeddedServer.kill, up=lambda s: s.start() and None),
    "stalled": Fault(down=_stop, up=_cont),
}


class TurnFailed(Exception):
    """The client was told the turn failed (an HTTP error, or the stream's error event)."""


@dataclass
class Agent:
    """One dialect's episode through its SDK: `turn` sends the history plus a user message and
    returns the reply's output token count (the usage the client was told), or raises TurnFailed.
    `mid_stream` runs after the stream's first event, before the rest is read."""

    base_url: str
    history: list[dict] = field(default_factory=list)

    def turn(self, text: str, stream: bool, mid_stream: Callable[[], None] | None = None) -> int:
        asked = [*self.history, {"role": "user", "content": text}]
        try:
            reply, tokens = self.send(asked, stream, mid_stream or (lambda: None))
        except (openai.APIError, anthropic.APIError) as e:
            raise TurnFailed(str(e)) from e
        self.history = [*asked, *reply]
        return tokens

    def send(self, asked: list[dict], stream: bool, mid_stream: Callable[[], None]) -> tuple[list[dict], int]:
        raise NotImplementedError


def _first_then(events: Any, mid_stream: Callable[[], None]) -> list[Any]:
    it = iter(events)
    seen = [next(it)]
    mid_stream()
    return seen + list(it)


class ChatAgent(Agent):
    def send(self, asked: list[dict], stream: bool, mid_stream: Callable[[], None]) -> tuple[list[dict], int]:
        client = openai.OpenAI(base_url=self.base_url, api_key="x", max_retries=0)
        kw: dict[str, Any] = {"model": "tiny", "messages": asked, "max_tokens": MAX_TOKENS}
        if not stream:
            r = client.chat.completions.create(**kw)
            return [r.choices[0].message.model_dump(exclude_none=True)], r.usage.completion_tokens
        chunks = client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
        chunks = _first_then(chunks, mid_stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        if chunks[-1].usage is None:
            raise TurnFailed("the stream ended without its usage chunk")
        return [{"role": "assistant", "content": text}], chunks[-1].usage.completion_tokens


class ResponsesAgent(Agent):
    def send(self, asked: list[dict], stream: bool, mid_stream: Callable[[], None]) -> tuple[list[dict], int]:
        client = openai.OpenAI(base_url=self.base_url, api_key="x", max_retries=0)
        kw: dict[str, Any] = {"model": "tiny", "input": asked, "max_output_tokens": MAX_TOKENS}
        if not stream:
            r = client.responses.create(**kw)
        else:
            with client.responses.stream(**kw) as s:
                last = _first_then(s, mid_stream)[-1]
            if last.type not in ("response.completed", "response.incomplete"):  # response.failed
                raise TurnFailed(f"the stream ended with {last.type}")
            r = last.response
        return [o.model_dump(exclude_none=True) for o in r.output], r.usage.output_tokens


class MessagesAgent(Agent):
    def send(self, asked: list[dict], stream: bool, mid_stream: Callable[[], None]) -> tuple[list[dict], int]:
        client = anthropic.Anthropic(base_url=self.base_url.removesuffix("/v1"), api_key="x", max_retries=0)
        kw: dict[str, Any] = {"model": "tiny", "messages": asked, "max_tokens": MAX_TOKENS}
        if not stream:
            m = client.messages.create(**kw)
        else:
            with client.messages.stream(**kw) as s:
                _first_then(s, mid_stream)
                m = s.get_final_message()
        content = [b.model_dump(exclude_none=True) for b in m.content]
        return [{"role": "assistant", "content": content}], m.usage.output_tokens


AGENTS = {"chat": ChatAgent, "responses": ResponsesAgent, "messages": MessagesAgent}
# (streamed, the step the store goes down at)
STEPS = [(False, "before"), (True, "before"), (True, "mid-stream")]


@contextlib.contextmanager
def down_during(fault: Fault, server: EmbeddedServer) -> Iterator[None]:
    fault.down(server)
    try:
        yield
    finally:
        fault.up(server)


@pytest.mark.parametrize("fault", FAULTS, ids=str)
@pytest.mark.parametrize(("stream", "step"), STEPS, ids=lambda x: {True: "streamed", False: "plain"}.get(x, x))
@pytest.mark.parametrize("dialect", AGENTS, ids=str)
async def test_the_store_holds_exactly_the_turns_the_agent_was_told_succeeded(
    router, valkey, dialect: str, stream: bool, step: str, fault: str
):
    url, run_id = router
    s = httpx.post(url + "/sessions", json={"group_id": uuid.uuid4().hex}, headers=ADMIN).json()
    agent = AGENTS[dialect](s["base_url"])
    told = [await asyncio.to_thread(agent.turn, "hi", stream)]  # output tokens of each turn it got
    faulted = FAULTS[fault]
    if step == "before":
        with down_during(faulted, valkey):
            for _ in range(2):  # the second attempt finds the first one still to take back
                with pytest.raises(TurnFailed):
                    await asyncio.to_thread(agent.turn, "more", stream)
    else:
        released.clear()

        def store_goes_down() -> None:
            faulted.down(valkey)
            released.set()

        try:
            with pytest.raises(TurnFailed):
                await asyncio.to_thread(agent.turn, "more", stream, store_goes_down)
        finally:
            released.set()
            faulted.up(valkey)
    told.append(await asyncio.to_thread(agent.turn, "more", stream))  # the retry
    told.append(await asyncio.to_thread(agent.turn, "and more", stream))
    finish = httpx.post(f"{url}/sessions/{s['session_id']}/finish", json={"reward": 1.0}, headers=ADMIN)
    assert finish.status_code == 200, finish.text
    assert finish.json()["turns"] == 3
    async with Buffer(valkey.url, run_id) as buf:
        turns = await buf.turns(s["session_id"])
        samples = await buf.session_samples(s["session_id"])
    assert [len(t.output_ids) for t in turns] == told
    assert [(t.turn_index, t.segment_index, t.split_reason) for t in turns] == [(i, 0, None) for i in range(3)]
    assert len(samples) == 1 and samples[0].reward == 1.0


def test_a_stream_is_kept_alive_while_its_turn_is_written(tiny_model, engine_url, valkey):
    """A frozen store holds the write up to `--store-timeout` after the last token: the client
    hears keep-alives through it (chat's is an empty delta), then the error event, not silence."""
    config = RouterConfig(
        model=tiny_model, engine=[engine_url], buffer_url=valkey.url, run_id=f"alive-{uuid.uuid4().hex[:8]}",
        admin_token=ADMIN_TOKEN, store_timeout=1.0, stream_keepalive=0.05,
    )  # fmt: skip
    with serve_app(create_app(config), startup_timeout=30) as url:
        s = httpx.post(url + "/sessions", json={"group_id": uuid.uuid4().hex}, headers=ADMIN).json()
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS}
        chat = s["base_url"] + "/chat/completions"
        with down_during(FAULTS["stalled"], valkey), httpx.stream("POST", chat, json={**body, "stream": True}) as r:
            events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    parsed = [json.loads(e) for e in events if e != "[DONE]"]
    assert "error" in parsed[-1], parsed[-1]  # the write failed: told in the stream
    last_token = max(i for i, e in enumerate(parsed) if e.get("choices") and e["choices"][0]["delta"])
    waited = parsed[last_token + 1 : -1]
    assert waited and all(e["choices"][0]["delta"] == {} for e in waited), waited
