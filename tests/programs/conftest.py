"""The agent programs as installed (`make agents`: tests/programs/package-lock.json into .cache/agents)
against a real router and a real embedded engine serving a tiny model with a long context: harness
prompts are 25k-50k tokens."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from slimeish.models.tiny import TinyModelConfig, make_tiny_model
from slimeish.router.config import RouterConfig
from slimeish.router.server import create_app
from slimeish.router.storage import MemoryStore
from tests.router.conftest import ADMIN_TOKEN, RouterUnderTest, recording_proxy, start_engine
from tests.router.test_anthropic_sdk import engine_calls
from tests.router.test_openai_sdk import assert_exact_capture
from tests.stand_in import serve_app

BIN = Path(__file__).resolve().parents[2] / ".cache" / "agents" / "node_modules" / ".bin"

# A random tiny model rarely samples its end token: the session's defaults (which the programs
# never see) stop it at the first vowel or space, so each turn is a few tokens.
SHORT = {"stop": list("aeiou "), "max_new_tokens": 16}
TASK = "Create a file named hello.txt containing the word hi, using your shell tool."


def program(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: `make agents` installs the pinned programs (tests/programs/package.json)")
    return str(path)


@dataclass
class Statuses:
    """Every HTTP answer the router gave, as (method, path, status): a session's path below its base URL
    (`/s/<key>/v1/responses` as `/responses`, `/s/<key>/v1beta/models/m:generateContent` as
    `/v1beta/models/m:generateContent`)."""

    seen: list[tuple[str, str, int]] = field(default_factory=list)

    def wrap(self, app: Any) -> Any:
        async def logged(scope: dict, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return await app(scope, receive, send)

            async def send_status(message: dict) -> None:
                if message["type"] == "http.response.start":
                    path = scope["path"]
                    if path.startswith("/s/"):
                        path = "/" + "".join(path.split("/", 3)[3:])  # `/s/<key>` itself as `/`
                        path = path.removeprefix("/v1") if path.startswith("/v1/") else path
                    self.seen.append((scope["method"], path, message["status"]))
                await send(message)

            await app(scope, receive, send_status)

        return logged


@dataclass
class Harness:
    router: RouterUnderTest
    statuses: Statuses

    def run(self, argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 540) -> subprocess.CompletedProcess:
        """The program as a user runs it, on a machine with no internet: its own environment only."""
        base = {"PATH": os.environ["PATH"], "HOME": str(cwd.parent / "home"), "LANG": "C.UTF-8"}
        (cwd.parent / "home").mkdir(exist_ok=True)
        return subprocess.run(
            argv, cwd=cwd, env=base | env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )

    def posts(self, seen: int) -> list[str]:
        """The paths of the POST requests answered since `seen` answers."""
        return [path for method, path, _ in self.statuses.seen[seen:] if method == "POST"]

    def check_episode(self, session: dict, start: int, answered_from: int) -> list:
        """Every request answered 2xx, the session sealed, and each stored sample exactly the tokens
        and log-probs the engine returned for the turns it holds. Returns the samples."""
        refused = [s for s in self.statuses.seen[answered_from:] if s[2] >= 400]
        assert not refused, refused
        calls = engine_calls(self.router.engine_log[start:])
        assert calls, "the program's request never reached the engine"
        r = httpx.post(
            f"{self.router.url}/sessions/{session['session_id']}/finish",
            json={"reward": 1.0},
            headers=self.router.admin,
        )
        assert r.status_code == 200, r.text
        samples = self.router.store.samples(session["session_id"])
        assert samples
        held = 0
        for sample in samples:
            own = [
                (q, a)
                for q, a in calls
                if sample.tokens[: len(q["input_ids"]) + len(a["output_ids"])] == q["input_ids"] + a["output_ids"]
            ]
            assert own, "a stored sample no engine call produced"
            assert_exact_capture(sample, own, None)
            held += len(own)
        assert held >= len(calls)
        return samples


@pytest.fixture(scope="session")
def long_context_model(tmp_path_factory) -> Path:
    # 262,144 as Qwen3-Coder's: a harness prompt plus the 128k output tokens Claude Code asks for fit
    cfg = TinyModelConfig(max_position_embeddings=262144)
    return make_tiny_model(tmp_path_factory.mktemp("tiny-long"), cfg)


@pytest.fixture(scope="module")
def harness(long_context_model, tmp_path_factory) -> Iterator[Harness]:
    engine, url = start_engine(long_context_model, tmp_path_factory.mktemp("program-engine"))
    log: list = []
    store = MemoryStore()
    statuses = Statuses()
    try:
        with serve_app(recording_proxy(url, log, timeout=600), startup_timeout=30) as proxy:
            config = RouterConfig(model=long_context_model, engine=[proxy], admin_token=ADMIN_TOKEN)
            app = create_app(config, store=store)
            with serve_app(statuses.wrap(app), startup_timeout=30) as router:
                admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
                yield Harness(RouterUnderTest(router, store, log, admin, app), statuses)
    finally:
        engine.stop()
