"""The agent programs as installed (`make agents`: tests/programs/package-lock.json into .cache/agents)
against a real router and a real embedded engine serving a tiny model with a long context: harness
prompts are 25k-50k tokens."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
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
from tests.scripted_engine import ScriptedEngine
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


@dataclass(frozen=True)
class Invocation:
    """A program's command line and environment, given a session as docs/agents.md says."""

    argv: list[str]
    env: dict[str, str]


def codex(session: dict, root: Path, task: str, *flags: str) -> Invocation:
    # Codex reads its base URL from its config only (OPENAI_BASE_URL is no longer read, 0.171): `-c`
    # sets it for this run, so its home (~/.codex, its sessions and logs) stays each run's own HOME's
    base_url = f'openai_base_url="{session["base_url"]}"'
    argv = [program("codex"), "exec", "--skip-git-repo-check", "-c", base_url, *flags, task]
    return Invocation(argv, {"OPENAI_API_KEY": session["api_key"]})


def claude_code(session: dict, root: Path, task: str, *flags: str) -> Invocation:
    env = {
        "ANTHROPIC_BASE_URL": session["base_url"].removesuffix("/v1"),
        "ANTHROPIC_API_KEY": session["api_key"],
        # no internet here: no update checks, telemetry or error reports
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    return Invocation([program("claude"), *flags, "-p", task], env)


def opencode(session: dict, root: Path, task: str, *flags: str) -> Invocation:
    # opencode takes an OpenAI-compatible server as a provider of its config; OPENCODE_CONFIG_CONTENT
    # carries it without a file (its `@ai-sdk/openai-compatible` provider ships inside the binary)
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "options": {"baseURL": session["base_url"], "apiKey": session["api_key"]},
    }
    config = {"provider": {"slimeish": {**provider, "models": {"tiny": {}}}}, "model": "slimeish/tiny"}
    env = {"OPENCODE_CONFIG_CONTENT": json.dumps(config), "OPENCODE_DISABLE_AUTOUPDATE": "1"}
    return Invocation([program("opencode"), "run", *flags, task], env)


def mini_swe_agent(session: dict, root: Path, task: str, *flags: str) -> Invocation:
    env = {
        "OPENAI_API_BASE": session["base_url"],  # litellm's `openai/` models: any OpenAI-compatible server
        "OPENAI_API_KEY": session["api_key"],
        "MSWEA_CONFIGURED": "true",  # skips its first-run setup questions
        "MSWEA_COST_TRACKING": "ignore_errors",  # litellm knows no price for this model
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no internet: litellm's bundled price list
    }
    # `-y`: its yolo mode, commands run without a confirmation; `--exit-immediately`: no question at the end
    argv = [str(Path(sys.executable).parent / "mini"), "-m", "openai/tiny", "-t", task, "-y", "--exit-immediately"]
    return Invocation([*argv, *flags], env)


def gemini_cli(session: dict, root: Path, task: str, *flags: str) -> Invocation:
    settings = root / "home" / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    # the API-key auth must be chosen in its settings (GOOGLE_GEMINI_BASE_URL alone selects its
    # "gateway" auth, which `-p` refuses); no internet here: no usage statistics or update checks
    config = {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    }
    settings.write_text(json.dumps(config))
    env = {
        "GOOGLE_GEMINI_BASE_URL": session["base_url"].removesuffix("/v1"),  # it appends /v1beta/models/...
        "GEMINI_API_KEY": session["api_key"],
        "GEMINI_CLI_TRUST_WORKSPACE": "true",  # `-p` runs only in a trusted folder
    }
    return Invocation([program("gemini"), *flags, "-p", task], env)


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


def turns_of(sample: Any, calls: list[tuple[dict, dict]]) -> list[int]:
    """The engine calls (indexes into `calls`, each a (request, reply)) whose prompt and output the
    sample's tokens begin with: the turns it holds (not those its prompt holds, as a split's does)."""
    prompt = len(sample.tokens) - sample.response_length
    return [
        i
        for i, (q, a) in enumerate(calls)
        if len(q["input_ids"]) >= prompt
        and sample.tokens[: len(q["input_ids"]) + len(a["output_ids"])] == q["input_ids"] + a["output_ids"]
    ]


@dataclass
class Harness:
    router: RouterUnderTest
    statuses: Statuses

    def run(self, invocation: Invocation, root: Path, timeout: float = 540) -> subprocess.CompletedProcess:
        """The program as a user runs it in `root`/work, on a machine with no internet: its own
        environment only, `root`/home its home."""
        (root / "work").mkdir(exist_ok=True)
        (root / "home").mkdir(exist_ok=True)
        base = {"PATH": os.environ["PATH"], "HOME": str(root / "home"), "LANG": "C.UTF-8"}
        return subprocess.run(
            invocation.argv,
            cwd=root / "work",
            env=base | invocation.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start_episode(self, name: str, **session: Any) -> tuple[dict, int, int]:
        """A new session (`name` its group), and where the engine's log and the answers stand."""
        record = self.router.new_session(group_id=f"g-{name}", **session)
        return record, len(self.router.engine_log), len(self.statuses.seen)

    def posts(self, seen: int) -> list[str]:
        """The paths of the POST requests answered since `seen` answers."""
        return [path for method, path, _ in self.statuses.seen[seen:] if method == "POST"]

    def check_episode(self, session: dict, start: int, answered_from: int, reward: float = 1.0) -> list:
        """Every request answered 2xx, the session sealed with `reward`, and each stored sample exactly
        the tokens and log-probs the engine returned for the turns it holds. Returns the samples."""
        refused = [s for s in self.statuses.seen[answered_from:] if s[2] >= 400]
        assert not refused, refused
        calls = engine_calls(self.router.engine_log[start:])
        assert calls, "the program's request never reached the engine"
        r = httpx.post(
            f"{self.router.url}/sessions/{session['session_id']}/finish",
            json={"reward": reward},
            headers=self.router.admin,
        )
        assert r.status_code == 200, r.text
        samples = self.router.store.samples(session["session_id"])
        assert samples
        held = 0
        for sample in samples:
            own = [calls[i] for i in turns_of(sample, calls)]
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


@contextlib.contextmanager
def serve_harness(model: Path, engine_url: str, engine_log: list) -> Iterator[Harness]:
    """A router on `model`'s tokenizer in front of the engine at `engine_url`, whose /generate calls
    `engine_log` holds as (request, reply), every answer it gives logged in `Statuses`."""
    store, statuses = MemoryStore(), Statuses()
    config = RouterConfig(model=model, engine=[engine_url], admin_token=ADMIN_TOKEN)
    app = create_app(config, store=store)
    with serve_app(statuses.wrap(app), startup_timeout=30) as router:
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        yield Harness(RouterUnderTest(router, store, engine_log, admin, app), statuses)


@pytest.fixture(scope="module")
def harness(long_context_model, tmp_path_factory) -> Iterator[Harness]:
    """The router in front of a real embedded engine serving the tiny model (through a recording proxy)."""
    engine, url = start_engine(long_context_model, tmp_path_factory.mktemp("program-engine"))
    log: list = []
    try:
        proxy = serve_app(recording_proxy(url, log, timeout=600), startup_timeout=30)
        with proxy as proxy_url, serve_harness(long_context_model, proxy_url, log) as harness:
            yield harness
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def scripted(long_context_model) -> Iterator[tuple[Harness, ScriptedEngine]]:
    """The router in front of the scripted stand-in engine (tests/scripted_engine.py) on the tiny
    model's tokenizer; each test sets the engine's `policy`."""
    engine = ScriptedEngine(long_context_model)
    with serve_app(engine.app(), startup_timeout=30) as url, serve_harness(long_context_model, url, engine.calls) as h:
        yield h, engine
