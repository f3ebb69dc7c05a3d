"""Router fixtures: a renderer on the tiny model, real embedded engines, and a running router."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import orjson
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

from slimeish.common.procs import ManagedProcess, free_port, wait_http
from slimeish.router.config import RouterConfig
from slimeish.router.renderers.template import ChatRenderer
from slimeish.router.server import create_app
from slimeish.router.storage import MemoryStore
from tests.stand_in import serve_app


@pytest.fixture(scope="session")
def renderer(tiny_model) -> ChatRenderer:
    return ChatRenderer(tiny_model)


def start_engine(model: Path, log_dir: Path, name: str = "engine", *args: str) -> tuple[ManagedProcess, str]:
    port = free_port()
    proc = ManagedProcess.slimeish(
        "engine", "--model", str(model), "--port", str(port), *args, log_path=log_dir / f"{name}-{port}.log"
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", timeout=120, proc=proc.proc)
    except Exception:
        proc.stop()
        raise
    return proc, url


@pytest.fixture(scope="session")
def engine_url(tiny_model, tmp_path_factory) -> Iterator[str]:
    """One embedded engine serving the tiny model for the whole session."""
    proc, url = start_engine(tiny_model, tmp_path_factory.mktemp("engine-logs"))
    yield url
    proc.stop()


def recording_proxy(target: str, log: list[tuple[dict, dict | list]], timeout: float = 120):
    """Forwards everything to `target` and logs each /generate (request, response): the test's
    view of what the engine really received and sampled, independent of the router's record."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        body = await request.body()
        async with httpx.AsyncClient(timeout=timeout) as client:
            r = await client.request(
                request.method, f"{target}/{path}", content=body, headers={"content-type": "application/json"}
            )
        if path == "generate" and r.status_code == 200:
            if r.headers["content-type"].startswith("text/event-stream"):  # a stream: log its chunks
                lines = [x[5:].strip() for x in r.text.splitlines() if x.startswith("data:")]
                log.append((orjson.loads(body), {"chunks": [orjson.loads(x) for x in lines if x != "[DONE]"]}))
                return Response(r.content, r.status_code, media_type="text/event-stream")
            log.append((orjson.loads(body), r.json()))
        return Response(r.content, r.status_code, media_type="application/json")

    return app


def stream_tampering_proxy(target: str, after_first: Callable[[list[bytes]], AsyncIterator[bytes]]) -> FastAPI:
    """Forwards everything to the engine at `target`, except that a streamed answer goes on after
    its first event with what `after_first(rest)` yields, `rest` being the engine's other events:
    an engine that pauses mid-stream, or dies there."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        async with httpx.AsyncClient(timeout=60) as client:
            r = await client.request(request.method, f"{target}/{path}", content=await request.body())
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))
        first, *rest = [e + b"\n\n" for e in r.content.split(b"\n\n") if e.strip()]

        async def tampered() -> AsyncIterator[bytes]:
            yield first
            async for event in after_first(rest):
                yield event

        return StreamingResponse(tampered(), media_type="text/event-stream")

    return app


@dataclass
class RouterUnderTest:
    url: str
    store: MemoryStore
    engine_log: list
    admin: dict
    app: FastAPI | None = None  # the in-process app, to look at its state

    def new_session(self, **body) -> dict:
        r = httpx.post(self.url + "/sessions", json=body, headers=self.admin)
        r.raise_for_status()
        return r.json()

    def record(self, session_id: str) -> dict:
        return httpx.get(f"{self.url}/sessions/{session_id}", headers=self.admin).json()


ADMIN_TOKEN = "admin-secret"


async def chat_episode(base_url: str, user_turns: Sequence[str], max_tokens: int) -> None:
    """A multi-turn agent through the async OpenAI SDK: each user turn follows the reply to the one before."""
    messages: list[dict] = []
    async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as client:
        for content in user_turns:
            messages.append({"role": "user", "content": content})
            r = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens)
            messages.append(r.choices[0].message.model_dump(exclude_none=True))


@pytest.fixture(scope="module")
def router_app(tiny_model, engine_url) -> Iterator[RouterUnderTest]:
    """A router (in-process, real HTTP) in front of a recording proxy to one real engine."""
    log: list = []
    store = MemoryStore()
    with serve_app(recording_proxy(engine_url, log), startup_timeout=30) as proxy:
        config = RouterConfig(model=tiny_model, engine=[proxy], admin_token=ADMIN_TOKEN, allow_anonymous=True)
        with serve_app(create_app(config, store=store), startup_timeout=30) as router:
            yield RouterUnderTest(router, store, log, {"Authorization": f"Bearer {ADMIN_TOKEN}"})


@pytest.fixture
def router_factory(tiny_model) -> Iterator:
    """`make(engine_urls, store=None, **config)` starts an in-process router; all are stopped after the test."""
    with contextlib.ExitStack() as servers:

        def make(engines: list[str], store: MemoryStore | None = None, **overrides) -> RouterUnderTest:
            store = store or MemoryStore()
            config = RouterConfig(model=tiny_model, engine=engines, admin_token=ADMIN_TOKEN, **overrides)
            app = create_app(config, store=store)
            url = servers.enter_context(serve_app(app, startup_timeout=30))
            return RouterUnderTest(url, store, [], {"Authorization": f"Bearer {ADMIN_TOKEN}"}, app)

        yield make


@pytest.fixture
def extra_engine(tiny_model, tmp_path) -> Iterator[tuple[ManagedProcess, str]]:
    """A second real engine owned by one test (which may kill it)."""
    proc, url = start_engine(tiny_model, tmp_path, "extra")
    yield proc, url
    proc.stop()
