"""Sessions: one agent episode each, reached with an unguessable API key."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from router.capture import Capture
from router.render import ChatRenderer

FinishStatus = Literal["completed", "truncated", "aborted", "failed"]


class CreateSession(BaseModel):
    group_id: str = Field(default_factory=lambda: secrets.token_hex(8), min_length=1)
    index: int = Field(0, ge=0)
    group_size: int = Field(1, ge=1)
    metadata: dict[str, Any] = Field(default_factory=dict)
    # False for evaluation episodes: captured and stored like any other, never handed to a trainer.
    trainable: bool = True


class FinishSession(BaseModel):
    reward: float | None = None
    status: FinishStatus = "completed"
    metadata: dict[str, Any] = Field(default_factory=dict)


@dataclass(eq=False)
class Session:
    session_id: str
    api_key: str
    group_id: str
    index: int
    group_size: int
    metadata: dict[str, Any]
    capture: Capture
    engine: str | None = None  # sticky engine URL (prefix-cache reuse)
    turns: int = 0
    finished: FinishSession | None = None
    created_at: float = field(default_factory=time.time)
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # keeps turn records in order
    _final: dict[str, Any] | None = field(default=None, repr=False)  # the summary kept after `seal`

    def seal(self, finish: FinishSession) -> None:
        """Mark finished and drop the capture state (tokens, history): nothing extends it any more."""
        self.finished = finish
        self._final = self.summary()
        self.capture.segments = []

    def summary(self) -> dict[str, Any]:
        if self._final is not None:
            return self._final
        return {
            "session_id": self.session_id,
            "group_id": self.group_id,
            "index": self.index,
            "group_size": self.group_size,
            "engine": self.engine,
            "turns": self.turns,
            "finished": self.finished.model_dump() if self.finished else None,
            "segments": [
                {"index": s.index, "split_reason": s.split_reason, "num_tokens": len(s.tokens)}
                for s in self.capture.segments
            ],
        }


class SessionRegistry:
    def __init__(self, renderer: ChatRenderer):
        self.renderer = renderer
        self.by_id: dict[str, Session] = {}
        self.by_key: dict[str, Session] = {}

    def create(self, req: CreateSession) -> Session:
        if req.index >= req.group_size:
            raise ValueError(f"index {req.index} must be < group_size {req.group_size}")
        session = Session(
            session_id="sess_" + secrets.token_hex(12),
            api_key="sk-slimeish-" + secrets.token_urlsafe(32),
            group_id=req.group_id,
            index=req.index,
            group_size=req.group_size,
            metadata=req.metadata,
            capture=Capture(self.renderer),
        )
        self.by_id[session.session_id] = session
        self.by_key[session.api_key] = session
        return session

    def by_api_key(self, key: str) -> Session | None:
        return self.by_key.get(key)
