"""A new dialect is one module implementing `slimeish.router.dialects.base.Dialect`: this one is a
toy API (`{"messages": [{"role", "content"}], "max_tokens", "stream"}` in, `{"reply"}` or
`data: {"delta"}` events out), defined here and mounted on a running router without touching any
router module. Its turns go through the one capture path: a non-streamed turn and a streamed turn
that extends it become one exactly captured sample.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import orjson
import pytest
from pydantic import BaseModel

from slimeish.router.config import RouterConfig
from slimeish.router.dialects.base import EngineChunks, endpoint
from slimeish.router.errors import APIError
from slimeish.router.jsontypes import JSONObject
from slimeish.router.pipeline import Conversation, PlannedTurn, assistant_message, parse
from slimeish.router.schemas import SamplingFields
from slimeish.router.server import create_app
from slimeish.router.sessions import Session
from slimeish.router.state import RouterState
from slimeish.router.storage import MemoryStore
from slimeish.router.streaming import ReplyStream, StreamedTurn
from slimeish.router.turns import Generation
from tests.router.conftest import ADMIN_TOKEN, recording_proxy
from tests.router.test_openai_sdk import assert_exact_capture
from tests.stand_in import serve_app


class ToyMessage(BaseModel):
    role: str
    content: str


class ToyRequest(BaseModel):
    messages: list[ToyMessage]
    max_tokens: int
    stream: bool = False


def _data(body: JSONObject) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"


@dataclass
class ToyTurn:
    stream: bool
    conversation: Conversation
    engine_extra: JSONObject

    def answer(
        self, state: RouterState, planned: PlannedTurn, gens: list[Generation], replies: list[JSONObject]
    ) -> JSONObject:
        return {"reply": replies[0]["content"]}

    async def events(
        self, state: RouterState, planned: PlannedTurn, chunks: EngineChunks, result: StreamedTurn
    ) -> AsyncIterator[bytes]:
        replies = ReplyStream(1, None, planned.params.get("stop", []))
        async for delta in replies.deltas(chunks):
            if delta.text:
                yield _data({"delta": delta.text})
        (done,) = replies.finish(lambda gen: assistant_message(state, gen, None))
        if done.last:
            yield _data({"delta": done.last})
        result.closing.append(_data({"done": True}))
        result.generations.append(done.generation)
        result.answers.append(done.message)

    def keepalive(self) -> bytes:
        return b": still here\n\n"

    def error_event(self, error: APIError) -> bytes:
        return _data({"failed": error.message})

    def recorded(self, body: JSONObject, answers: list[JSONObject]) -> None:
        """Nothing to keep: the toy client sends its whole history."""


class Toy:
    def turn(self, state: RouterState, session: Session | None, body: JSONObject) -> ToyTurn:
        req = parse(ToyRequest, body)
        messages = [m.model_dump() for m in req.messages]
        sampling = SamplingFields(n=1, max_tokens=req.max_tokens)
        return ToyTurn(req.stream, Conversation(messages, None, sampling, req.max_tokens), {})


@pytest.fixture(scope="module")
def toy_router(tiny_model, engine_url):
    """A router with the toy dialect mounted at `<base_url>/toy`, in front of a recording proxy."""
    log: list = []
    store = MemoryStore()
    with serve_app(recording_proxy(engine_url, log), startup_timeout=30) as proxy:
        app = create_app(RouterConfig(model=tiny_model, engine=[proxy], admin_token=ADMIN_TOKEN), store=store)
        app.add_api_route("/s/{api_key}/v1/toy", endpoint(Toy()), methods=["POST"])
        with serve_app(app, startup_timeout=30) as url:
            yield url, store, log


def _streamed(r: httpx.Response) -> list[JSONObject]:
    return [orjson.loads(x[5:]) for x in r.text.splitlines() if x.startswith("data:")]


def test_a_toy_dialect_in_one_module_is_captured_exactly(toy_router, renderer):
    url, store, log = toy_router
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    session = httpx.post(url + "/sessions", json={}, headers=admin).json()
    messages = [{"role": "user", "content": "hi"}]
    r = httpx.post(session["base_url"] + "/toy", json={"messages": messages, "max_tokens": 6}, timeout=60)
    assert r.status_code == 200, r.text
    first = r.json()["reply"]
    assert first == log[-1][1]["text"]

    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "more"}]
    r = httpx.post(
        session["base_url"] + "/toy", json={"messages": messages, "max_tokens": 6, "stream": True}, timeout=60
    )
    events = _streamed(r)
    assert events[-1] == {"done": True}
    streamed = "".join(e["delta"] for e in events[:-1])
    assert streamed == "".join(c.get("text", "") for c in log[-1][1]["chunks"][-1:])  # cumulative last chunk

    httpx.post(f"{url}/sessions/{session['session_id']}/finish", json={"reward": 1.0}, headers=admin)
    (sample,) = store.samples(session["session_id"])  # one segment: the second turn extended the first
    final = log[-1][1]["chunks"][-1]
    calls = [log[-2], (log[-1][0], {"output_ids": final["output_ids"], "meta_info": final["meta_info"]})]
    assert_exact_capture(sample, calls, renderer)


def test_the_toy_dialects_bad_request_is_refused_before_any_turn(toy_router):
    url, _, _ = toy_router
    session = httpx.post(url + "/sessions", json={}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    r = httpx.post(session["base_url"] + "/toy", json={"messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    record = httpx.get(f"{url}/sessions/{session['session_id']}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert record.json()["turns"] == 0
