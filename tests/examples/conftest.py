"""A stand-in OpenAI-compatible server on loopback, for the examples' unit tests.

It replaces the slimeish router (its `/v1/chat/completions`) and an SGLang server (its
`/model_info`) so the example agent runs through the real `openai` SDK over real HTTP, without an
engine or a model. Chat replies are scripted per test; every request is recorded with its
`Authorization` header.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request

from tests.stand_in import StandIn, stand_in_fixtures


@dataclass
class StandInServer(StandIn):
    replies: list[str] = field(default_factory=list)  # assistant contents, answered in order
    requests: list[dict[str, Any]] = field(default_factory=list)  # {"auth", "body"}
    weight_version: str = "0"


def build_app(state: StandInServer) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        state.requests.append({"auth": request.headers.get("authorization"), "body": await request.json()})
        content = state.replies.pop(0)
        message = {"role": "assistant", "content": content}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return {"id": "chatcmpl-0", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}

    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": "stand-in", "weight_version": state.weight_version}

    return app


stand_in_server, server = stand_in_fixtures("server", StandInServer, build_app)
