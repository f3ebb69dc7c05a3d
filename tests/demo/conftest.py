"""A stand-in for slimeish's router, served over real HTTP on loopback.

It replaces the router (sessions + OpenAI chat endpoint) in the demo's unit tests so the agent
and the openai_agent rollout function are exercised through the real `openai` SDK and `httpx`,
without an engine or a model. Chat replies are scripted per test: a function of the request body.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, HTTPException, Request

from tests.stand_in import StandIn, stand_in_fixtures

ADMIN_TOKEN = "admin-secret"
Reply = Callable[[dict[str, Any]], dict[str, Any]]  # request body -> assistant message


@dataclass
class StandInRouter(StandIn):
    reply: Reply | None = None
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)  # session_id -> create body + finish
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (session_id, chat body)


def chat_completion(message: dict[str, Any]) -> dict[str, Any]:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "tiny",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
    }


def build_app(state: StandInRouter) -> FastAPI:
    app = FastAPI()
    keys: dict[str, str] = {}

    def check_admin(request: Request) -> None:
        if request.headers.get("authorization") != f"Bearer {ADMIN_TOKEN}":
            raise HTTPException(401, "bad admin token")

    @app.post("/sessions")
    async def create(request: Request) -> dict[str, str]:
        check_admin(request)
        session_id, key = secrets.token_hex(4), secrets.token_hex(8)
        keys[key] = session_id
        state.sessions[session_id] = {"create": await request.json(), "finish": None}
        return {"session_id": session_id, "api_key": key, "base_url": f"{state.url}/s/{key}/v1"}

    @app.post("/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request) -> dict[str, Any]:
        check_admin(request)
        state.sessions[session_id]["finish"] = await request.json()
        return {"session_id": session_id, "samples": 1}

    @app.post("/sessions/{session_id}/abort")
    async def abort(session_id: str, request: Request) -> dict[str, Any]:
        check_admin(request)  # an episode lost to its infrastructure: recorded as an aborted finish
        state.sessions[session_id]["finish"] = {"reward": None, "status": "aborted", "metadata": {}}
        return {"session_id": session_id, "place_freed": True}

    @app.post("/s/{key}/v1/chat/completions")
    async def chat(key: str, request: Request) -> dict[str, Any]:
        if key not in keys:
            raise HTTPException(401, "unknown session key")
        body = await request.json()
        state.requests.append((keys[key], body))
        assert state.reply is not None, "the test must script the replies"
        return chat_completion(state.reply(body))

    return app


stand_in_router, router = stand_in_fixtures("router", StandInRouter, build_app)
