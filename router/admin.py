"""Session lifecycle (`/sessions`) and the operator API (`/admin`), behind the admin token."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal, TypeVar

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel

from slimeish.buffer import SessionInfo
from slimeish.common.sample import Status
from slimeish.router.capture import NEXT_TURN_PROMPT
from slimeish.router.engines import UPDATE_PATHS, UpdatePath, refused_by_all, update_target
from slimeish.router.errors import APIError
from slimeish.router.jsontypes import JSONObject
from slimeish.router.pipeline import bearer_token, parse, read_json, request_key
from slimeish.router.sessions import Closed, CreateSession, FinishSession, Session
from slimeish.router.state import RouterState, get_state
from slimeish.router.storage import STORE_ERRORS, StoreUnavailable

admin = APIRouter()
log = logging.getLogger(__name__)


def require_admin(state: RouterState, request: Request) -> None:
    token = state.config.admin_token
    if token and not hmac.compare_digest(bearer_token(request).encode(), token.encode()):
        raise APIError(401, "admin token required", type="authentication_error", code="invalid_admin_token")


async def admin_state(request: Request) -> RouterState:
    """The router state, for a request that carries the admin token."""
    state = get_state(request)
    require_admin(state, request)
    return state


M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency parsing the JSON body into `model` (OpenAI-shaped 400 when it does not fit)."""

    async def dependency(request: Request) -> M:
        return parse(model, await read_json(request))

    return dependency


AdminState = Annotated[RouterState, Depends(admin_state)]


def _session(state: RouterState, session_id: str) -> Session | Closed:
    """The open session, or what is kept of a finished one."""
    session = state.sessions.by_id.get(session_id) or state.sessions.closed_by_id.get(session_id)
    if session is None:
        raise APIError(404, f"no session {session_id!r}", code="session_not_found")
    return session


async def _stored(write: Awaitable[T], what: str) -> T:
    """Await a store write; failing to reach the store is `StoreUnavailable` (a 503; a refusal stays a 400/409)."""
    try:
        return await write
    except STORE_ERRORS as e:
        log.exception("storing %s failed", what)
        raise StoreUnavailable(what, e) from e


def _finished(session_id: str) -> APIError:
    return APIError(409, f"session {session_id} is already finished", code="session_finished")


async def _open(state: RouterState, session: Session, info: SessionInfo) -> None:
    """Open the session in the store, then make it reachable. A retry sends the same open again,
    which the store answers as the first time."""
    try:
        await _stored(state.store.open_session(info), "the session")
    except StoreUnavailable:
        raise  # the write may still land: the session is kept for the retry (`SessionRegistry.create`)
    except Exception:
        state.sessions.forget(session)  # a refusal leaves no session behind
        raise
    if state.sessions.register(session):  # concurrent retries: counted once
        state.metrics.active_sessions.inc()


@admin.post("/sessions")
async def create_session(
    request: Request, state: AdminState, req: Annotated[CreateSession, Depends(json_body(CreateSession))]
) -> JSONObject:
    if req.lora_path is not None:  # refused now, not at the session's first turn
        served, loaded = await state.pool.serves_adapter(req.lora_path)
        if not served:
            raise APIError(
                400,
                f"lora_path {req.lora_path!r} names no LoRA adapter loaded on the engines; loaded: {loaded} "
                "(a run's weight sync loads its adapter under its --lora-name)",
                param="lora_path",
                code="adapter_not_loaded",
            )
    try:
        session = state.sessions.create(req)
    except ValueError as e:
        raise APIError(400, str(e), param="index") from None
    if session.identity.session_id not in state.sessions.by_id:  # else a retry whose first answer was lost
        # a LoRA session's samples say which adapter sampled them (its own, else the router's)
        adapter = req.lora_path or state.config.lora_path
        metadata = req.metadata | ({"lora_path": adapter} if adapter else {})
        info = SessionInfo(
            session.identity.session_id, req.group_id, req.index, req.group_size, metadata, req.trainable,
            owner=state.config.router_id,
        )  # fmt: skip
        await _open(state, session, info)
    base = str(request.base_url).rstrip("/")
    return {
        "session_id": session.identity.session_id,
        "api_key": session.identity.api_key,
        "base_url": f"{base}/s/{session.identity.api_key}/v1",
        "group_id": session.identity.group_id,
        "index": session.identity.index,
    }


@admin.get("/sessions/{session_id}")
async def get_session(state: AdminState, session_id: str) -> JSONObject:
    session = _session(state, session_id)
    return session.summary if isinstance(session, Closed) else session.summary()


def _endable(state: RouterState, request: Request, session_id: str) -> Session | Closed:
    """The session a finish or an abort ends; allowed with the admin token or the session's own
    key. Without either, 401 whatever the id: a 404 for unknown ids would tell which ones exist."""
    known = state.sessions.by_id.get(session_id) or state.sessions.closed_by_id.get(session_id)
    if known is None or not hmac.compare_digest(request_key(request).encode(), known.identity.api_key.encode()):
        require_admin(state, request)
    return _session(state, session_id)


async def _end(
    state: RouterState,
    session: Session | Closed,
    outcome: FinishSession,
    store: Callable[[Session], Awaitable[None]],
    wait: bool,
) -> JSONObject:
    """Seal `session` with `outcome` once `store` (run under its write lock, after any turn still
    being written) stored its end; with `wait`, first wait for the turns still generating."""
    if isinstance(session, Closed) or session.closed:  # checked and set with no await in between
        raise _finished(session.identity.session_id)
    with session.finishing():
        if wait and not await session.wait_idle(state.config.finish_timeout):
            log.warning("finishing %s with %d turn(s) still generating", session.identity.session_id, session.inflight)
        async with session.ledger.write_lock:
            if session.finished is not None:
                raise _finished(session.identity.session_id)
            await store(session)
            session.seal(outcome)
    state.metrics.active_sessions.dec()
    state.pool.release(session.ledger.engine)
    state.sessions.close(session)
    return session.summary()


@admin.post("/sessions/{session_id}/finish")
async def finish_session(request: Request, session_id: str) -> JSONObject:
    """Seal an episode with its outcome (admin token or the session's own key)."""
    state = get_state(request)
    session = _endable(state, request, session_id)
    req: FinishSession = parse(FinishSession, await read_json(request))

    async def store(session: Session) -> None:
        await state.runner.confirm_locked(session)  # its failed turn revoked first
        metadata = {**req.metadata, NEXT_TURN_PROMPT: session.capture.next_turn_prompt}  # on its samples
        await _stored(state.store.finish_session(session_id, req.reward, req.status, metadata), "the finish")

    return await _end(state, session, req, store, wait=True)


@admin.post("/sessions/{session_id}/abort")
async def abort_session(request: Request, session_id: str) -> JSONObject:
    """The episode was lost to its infrastructure (the worker running its agent died), not failed
    by its agent: seal the session as aborted and give its group place back in the buffer, for
    the rollout side to generate the member again at the same index. Turns still generating are
    not waited for: nobody reads their answers, and their records are refused (409). The summary's
    `place_freed` is False when this call freed nothing in the buffer (an earlier attempt whose
    answer was lost, or a recovery, already had)."""
    state = get_state(request)
    session = _endable(state, request, session_id)
    freed = False

    async def store(session: Session) -> None:
        nonlocal freed
        freed = await _stored(state.store.abort_session(session_id), "the abort")

    summary = await _end(state, session, FinishSession(status=Status.ABORTED), store, wait=False)
    return {**summary, "place_freed": freed}


class EngineURL(BaseModel):
    url: str


EngineBody = Annotated[EngineURL, Depends(json_body(EngineURL))]


def _pool(state: RouterState) -> JSONObject:
    """The engines, and the versions of the last updates this router did or recorded: of the base
    weights, and of each LoRA adapter."""
    updates = state.pool.updates
    base = updates.get(None)
    return {
        "engines": [e.as_dict() for e in state.pool.engines.values()],
        "weight_version": base and base.version,
        "adapter_versions": {u.adapter: u.version for u in updates.values() if u.adapter is not None},
    }


@admin.get("/admin/engines")
async def list_engines(state: AdminState) -> JSONObject:
    return _pool(state)


@admin.post("/admin/engines")
async def add_engine(state: AdminState, req: EngineBody) -> JSONObject:
    try:
        engine = await state.pool.admit(req.url)
    except ValueError as e:
        raise APIError(400, str(e), param="url") from None
    return engine.as_dict()


@admin.delete("/admin/engines")
async def remove_engine(state: AdminState, req: EngineBody) -> JSONObject:
    try:
        state.pool.remove(req.url)
    except KeyError:
        raise APIError(404, f"no engine {req.url!r}", param="url", code="engine_not_found") from None
    return _pool(state)


class RecordUpdate(BaseModel):
    path: UpdatePath | Literal["/unload_lora_adapter"]  # an unload: the adapter's last load is forgotten
    body: JSONObject


@admin.post("/admin/record_update")
async def record_update(
    state: AdminState, req: Annotated[RecordUpdate, Depends(json_body(RecordUpdate))]
) -> JSONObject:
    """An update another router of the run fanned out to the engines: remembered, not sent, so an
    engine that comes back behind it is caught up here too (router replicas). An adapter's unload
    is forgotten here too, so no router gives the adapter back to an engine that returns."""
    try:
        await state.pool.record(req.path, req.body)
    except ValueError as e:
        raise APIError(400, str(e), param="body") from None
    return _pool(state)


_FAN_OUT = (
    "pause_generation",
    "continue_generation",
    "flush_cache",
    "update_weights_from_disk",
    "update_weights_from_tensor",
    "load_lora_adapter",
    "unload_lora_adapter",
)


def _fan_out_route(name: str) -> None:
    async def handler(request: Request, state: AdminState) -> JSONObject:
        body = await read_json(request) if await request.body() else {}
        results = await state.pool.fan_out("/" + name, body)
        if "/" + name in UPDATE_PATHS:
            target = update_target("/" + name, body)  # a LoRA adapter's load: that adapter's version
            for r in results:  # as each engine reported it after the update (None: not reached)
                r["weight_version"] = state.pool.engines[r["url"]].version(target) if r["ok"] else None
        return {"ok": not refused_by_all(results), "engines": results}

    admin.add_api_route(f"/admin/{name}", handler, methods=["POST"], name=name)


for _name in _FAN_OUT:
    _fan_out_route(_name)
