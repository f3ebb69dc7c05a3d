"""Sessions: one agent episode each, reached with an unguessable API key."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, cast

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from slimeish.common.sample import Status
from slimeish.router.capture import SAMPLED, Capture
from slimeish.router.engine_api import SamplingParams
from slimeish.router.jsontypes import JSONObject
from slimeish.router.renderers.base import Renderer
from slimeish.router.schemas import TopK

_FINISHES = [s for s in Status if s is not Status.PENDING]  # PENDING is an open session, not an end


def _finish_status(value: Any) -> Any:
    if value not in _FINISHES:  # the error a Literal of the values would give
        expected = ", ".join(repr(s.value) for s in _FINISHES[:-1]) + f" or {_FINISHES[-1].value!r}"
        raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
    return value


class SamplingDefaults(BaseModel):
    """Sampling for the session's turns that leave a field out (an explicit value wins): how a
    trainer's rollout settings reach an agent it does not control. No upper bound on temperature,
    unlike OpenAI's 2: the engine takes any, and so does the token-in rollout."""

    model_config = ConfigDict(extra="forbid", strict=True)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: TopK | None = None
    max_new_tokens: int | None = Field(
        default=None, ge=1
    )  # a turn's budget when it sets no max_tokens (capped by the context)
    stop: list[str] | None = None


class CreateSession(BaseModel):
    group_id: str = Field(default_factory=lambda: secrets.token_hex(8), min_length=1)
    index: int = Field(0, ge=0)
    group_size: int = Field(1, ge=1)
    metadata: dict[str, Any] = Field(default_factory=dict)
    # False for evaluation episodes: captured and stored like any other, never handed to a trainer.
    trainable: bool = True
    sampling_defaults: SamplingDefaults = Field(default_factory=SamplingDefaults)
    # The LoRA adapter (a policy's, loaded on the engines under this name) every turn samples with:
    # several policies share the engines, each session bound to one. None: the router's --lora-path.
    lora_path: str | None = Field(default=None, min_length=1)


class FinishSession(BaseModel):
    reward: float | None = None
    status: Annotated[Status, BeforeValidator(_finish_status)] = Status.COMPLETED
    metadata: dict[str, Any] = Field(default_factory=dict)


@dataclass
class StoredResponse:
    conversation: list[JSONObject]  # chat messages, the response's reply last
    body: bytes  # the response object as answered, as JSON: kept per turn, so out of the GC's walk


@dataclass(frozen=True, slots=True)
class SessionIdentity:
    """Who the session is and the key that reaches it: fixed when the registry creates it."""

    session_id: str
    api_key: str
    group_id: str
    index: int
    group_size: int
    metadata: Mapping[str, Any]
    sampling_defaults: SamplingParams  # the ones a turn may omit (read-only: copied where a turn adds its own)
    lora_path: str | None = None  # its policy's LoRA adapter; None: the router's --lora-path


@dataclass(eq=False, slots=True)
class TurnLedger:
    """What the store holds of the session and where its turns run; written only by
    `turns.TurnRunner` (tests/router/test_session_owners.py)."""

    engine: str | None = None  # sticky engine URL (prefix-cache reuse)
    turns: int = 0  # turns the store confirmed
    # The index of the first turn whose write failed (its client was told so), None when there is
    # none: the write may land late, so it is revoked before anything else is written for the
    # session, which then writes at the next `epoch` (the buffer refuses writes from older ones).
    revoke_from: int | None = None
    epoch: int = 0
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # keeps turn records in order


@dataclass(eq=False, slots=True)
class DialectMemory:
    """What the dialects keep between the session's turns; each field has one writer."""

    # Responses API `store` (dialects.responses): each stored response, which a later turn
    # continues with `previous_response_id` and `GET /v1/responses/{id}` returns.
    responses: dict[str, StoredResponse] = field(default_factory=dict)
    # The last non-streamed request's body and its answer (body, media type), replayed to an SDK's
    # retry (pipeline).
    last_answer: tuple[bytes, bytes, str | None] | None = None
    converted: dict[str, Any] = field(default_factory=dict)  # per dialect: its last conversion (dialects.incremental)


class Session:
    """One episode, split by concern: `identity` (frozen), `capture` (its tokens, written by
    capture.Capture's methods), `ledger` (turns.TurnRunner), `memory` (the dialects), and its
    lifecycle (in-flight turns, finishing, finished), written only through the methods here."""

    def __init__(self, identity: SessionIdentity, capture: Capture):
        self.identity = identity
        self.capture = capture
        self.ledger = TurnLedger()
        self.memory = DialectMemory()
        self._finished: FinishSession | None = None
        self._finishing = False  # a finish is waiting for in-flight turns: new turns are refused
        self._inflight = 0  # turns between request and record (or failure)
        self._idle = asyncio.Event()  # set while no turn is in flight
        self._idle.set()
        self._final: dict[str, Any] | None = None  # the summary kept after `seal`

    @property
    def finished(self) -> FinishSession | None:
        return self._finished

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def closed(self) -> bool:
        """Finished, or being finished: no new turn may start."""
        return self._finished is not None or self._finishing

    def begin_turn(self) -> None:
        self._inflight += 1
        self._idle.clear()

    def end_turn(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()

    @contextlib.contextmanager
    def finishing(self) -> Iterator[None]:
        """New turns are refused while a finish runs; afterwards `finished` refuses them, unless
        the finish failed (the store refused it) and left the session open."""
        self._finishing = True
        try:
            yield
        finally:
            self._finishing = False

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no turn is in flight; False if `timeout` passed first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        return self._inflight == 0

    def seal(self, finish: FinishSession) -> None:
        """Mark finished and drop the capture state (tokens, history): nothing extends it any more."""
        self._finished = finish
        self._final = self.summary()
        self.capture.clear()
        self.memory = DialectMemory()

    def summary(self) -> dict[str, Any]:
        if self._final is not None:
            return self._final
        ident = self.identity
        return {
            "session_id": ident.session_id,
            "group_id": ident.group_id,
            "index": ident.index,
            "group_size": ident.group_size,
            "sampling_defaults": dict(ident.sampling_defaults),
            "lora_path": ident.lora_path,
            "engine": self.ledger.engine,
            "turns": self.ledger.turns,
            "finished": self._finished.model_dump() if self._finished else None,
            "segments": [
                {"index": s.index, "split_reason": s.split_reason, "num_tokens": len(s.tokens)}
                for s in self.capture.segments
            ],
        }


@dataclass(frozen=True)
class Closed:
    """What is kept of a finished session: enough to answer 409 to its key and `GET` its summary."""

    identity: SessionIdentity
    summary: dict[str, Any]


class SessionRegistry:
    """Open sessions by id and key; finished ones leave these maps and only their summaries stay,
    the most recent `keep_finished` of them (older ones answer 404 / 401)."""

    def __init__(self, renderer: Renderer, keep_finished: int = 10_000, next_turn_prompt: str = SAMPLED):
        self.renderer = renderer
        self.next_turn_prompt = next_turn_prompt
        self.keep_finished = keep_finished
        self.by_id: dict[str, Session] = {}
        self.by_key: dict[str, Session] = {}
        self.closed_by_id: OrderedDict[str, Closed] = OrderedDict()
        self.closed_by_key: dict[str, Closed] = {}
        # (group id, index) -> the request and the session it created, until the session is
        # finished: a retried create gets the same session (see `create`).
        self.by_slot: dict[tuple[str, int], tuple[CreateSession, Session]] = {}

    def create(self, req: CreateSession) -> Session:
        """The session for `req`, not yet reachable: `register` it once the store has it.

        The same request again (same group id, index and fields) gets the same session, whether
        its first open was confirmed or not: a store write that timed out may land later, and a
        new session id would then find its place in the group taken."""
        if req.index >= req.group_size:
            raise ValueError(f"index {req.index} must be < group_size {req.group_size}")
        slot = (req.group_id, req.index)
        if (earlier := self.by_slot.get(slot)) is not None and earlier[0] == req:
            return earlier[1]
        identity = SessionIdentity(
            session_id="sess_" + secrets.token_hex(12),
            api_key="sk-slimeish-" + secrets.token_urlsafe(32),
            group_id=req.group_id,
            index=req.index,
            group_size=req.group_size,
            metadata=req.metadata,
            sampling_defaults=cast(SamplingParams, req.sampling_defaults.model_dump(exclude_none=True)),
            lora_path=req.lora_path,
        )
        session = Session(identity, self.new_capture())
        self.by_slot[slot] = (req, session)
        return session

    def new_capture(self) -> Capture:
        """A session's capture (or an anonymous request's, which is not recorded)."""
        return Capture(self.renderer, self.next_turn_prompt)

    def forget(self, session: Session) -> None:
        """Drop a created session the store refused: a new request for its slot starts afresh."""
        slot = (session.identity.group_id, session.identity.index)
        if (earlier := self.by_slot.get(slot)) is not None and earlier[1] is session:
            del self.by_slot[slot]

    def register(self, session: Session) -> bool:
        """Make a created session reachable (once the store has opened it); False if it already was."""
        ident = session.identity
        if ident.session_id in self.by_id:
            return False
        self.by_id[ident.session_id] = session
        self.by_key[ident.api_key] = session
        return True

    def by_api_key(self, key: str) -> Session | None:
        return self.by_key.get(key)

    def knows(self, key: str) -> bool:
        """Whether `key` is (or was, as far as the kept summaries go) a session's key."""
        return key in self.by_key or key in self.closed_by_key

    def close(self, session: Session) -> None:
        """Drop a sealed session from the open maps, keeping its summary in the bounded LRU."""
        ident = session.identity
        self.by_id.pop(ident.session_id, None)
        self.by_key.pop(ident.api_key, None)
        self.forget(session)
        self.closed_by_id[ident.session_id] = self.closed_by_key[ident.api_key] = Closed(ident, session.summary())
        while len(self.closed_by_id) > self.keep_finished:
            _, old = self.closed_by_id.popitem(last=False)
            self.closed_by_key.pop(old.identity.api_key, None)
