"""`slimeish router`: the FastAPI app, its lifespan (shared clients, health loop) and `main`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import functools
import gc
import ipaddress
import logging.config
import resource
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import uvicorn
import uvicorn.config
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from slimeish.common.config import add_dataclass_args, from_namespace
from slimeish.common.redact import RedactSecrets, mask_loggers
from slimeish.router.admin import admin
from slimeish.router.api_v1 import api
from slimeish.router.config import RouterConfig
from slimeish.router.connections import ConnectionCaps, GuardedProtocol
from slimeish.router.dispatch import RouterApp
from slimeish.router.engine_http import engine_client
from slimeish.router.engine_pool import EnginePool
from slimeish.router.errors import install_error_handlers
from slimeish.router.limits import max_token_chars
from slimeish.router.metrics import RouterMetrics
from slimeish.router.pipeline import session_for_key
from slimeish.router.renderers.base import Renderer
from slimeish.router.renderers.select import load_renderer
from slimeish.router.sessions import SessionRegistry
from slimeish.router.state import RouterState, get_state
from slimeish.router.storage import BufferUnreachable, MemoryStore, TurnStore, wait_for_buffer
from slimeish.router.turns import TurnRunner


async def open_store(config: RouterConfig) -> TurnStore:
    if config.buffer_url is None:
        return MemoryStore(config.keep_finished)
    from slimeish.router.storage import BufferStore

    return await BufferStore.connect(
        config.buffer_url,
        config.run_id,
        config.store_timeout,
        recover=config.recover_open_sessions,
        owner=config.router_id,
        connect_timeout=config.buffer_connect_timeout,
    )


def next_turn_prompt(config: RouterConfig, renderer: Renderer) -> str:
    """`--next-turn-prompt`, `auto` resolved to the family's choice."""
    return renderer.next_turn_prompt if config.next_turn_prompt == "auto" else config.next_turn_prompt


def _build_state(config: RouterConfig, store: TurnStore, client: aiohttp.ClientSession) -> RouterState:
    renderer = load_renderer(config.model, config.renderer)
    metrics = RouterMetrics()
    pool = EnginePool(
        client,
        config.engine,
        timeout=config.request_timeout,
        retries=config.engine_retries,
        check_timeout=config.health_check_timeout,
        failure_threshold=config.health_failure_threshold,
    )
    return RouterState(
        config=config,
        renderer=renderer,
        sessions=SessionRegistry(renderer, config.keep_finished, next_turn_prompt(config, renderer)),
        pool=pool,
        store=store,
        runner=TurnRunner(
            pool, store, metrics, routed_experts=config.return_routed_experts, lora_path=config.lora_path
        ),
        metrics=metrics,
        model_name=config.served_model_name or config.model.name,
        context_length=config.context_length or renderer.context_length,
        token_chars=max_token_chars(renderer.tokenizer.get_vocab()),
        tokenizer=renderer.tokenizer.backend_tokenizer if renderer.tokenizer.is_fast else None,
    )


def create_app(config: RouterConfig, store: TurnStore | None = None, freeze_gc: bool = False) -> RouterApp:
    """The router app; `store` overrides the one `config` names (tests pass a MemoryStore).
    `freeze_gc` is for a process that serves only this app (see `_tune_gc`)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with engine_client() as client:
            state = _build_state(config, store or await open_store(config), client)
            app.state.router = state
            await state.pool.check_health()
            if freeze_gc:
                _tune_gc()
            health = asyncio.create_task(state.pool.health_loop(config.health_interval))
            try:
                yield
            finally:
                health.cancel()
                state.pool.close()
                await state.store.close()

    # Wherever it is served (a test's server, an embedding program), what the router logs is masked.
    mask_loggers("slimeish.router", "uvicorn.error", "uvicorn.access")
    app = RouterApp(title="slimeish router", lifespan=lifespan)
    app.include_router(api)
    app.include_router(admin)
    install_error_handlers(app)
    _install_observability(app)
    _install_base_urls(app)
    return app


def _tune_gc() -> None:
    """Keep the objects built at start-up (transformers, the tokenizer, FastAPI: ~400k) out of
    every later garbage collection. Without this, each full collection walks all of them: a
    ~100 ms pause of the event loop every few seconds under load, i.e. every request in flight
    then waits that long (the router's p99, docs/benchmarks.md).

    Then collect the youngest generation every 10,000 net container allocations, not 700: a turn
    allocates hundreds (its parsed body, a Responses request's items five each) that reference
    counting frees once it is answered (no path leaves cyclic garbage: bench/router_profile.py),
    so a collection every few requests found nothing to free, only promoted the turns in flight
    towards the old generation, whose full collections then walked every session's history."""
    gc.collect()  # what is garbage now would otherwise be frozen with the rest, never freed
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


class MetricsMiddleware:
    """Counts requests by endpoint and status and times them (plain ASGI: no per-request task)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), [500]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            endpoint = getattr(scope.get("route"), "path", "unmatched").replace("/s/{api_key}", "")
            scope["app"].state.router.metrics.observe(endpoint, status[0], time.perf_counter() - started)


def _install_observability(app: FastAPI) -> None:
    app.add_middleware(MetricsMiddleware)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        state = get_state(request)
        for engine in state.pool.engines.values():
            state.metrics.engine_healthy.labels(engine.url).set(1 if engine.healthy else 0)
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        report = await health_report(get_state(request))
        return JSONResponse(report, 200 if report["ok"] else 503)


def _since(started: Any) -> str:
    """ ", since <when> (<how long>)" for a wall time, "" for None."""
    if started is None:
        return ""
    return f", since {time.strftime('%H:%M:%S', time.gmtime(started))} UTC ({time.time() - started:.0f} s)"


async def health_report(state: RouterState) -> dict[str, Any]:
    """`/health`'s body: `ok` while an engine is healthy and the buffer (if any) answers, and each
    dependency's state; `problems` names the causes when not ok, one line each."""
    engines = list(state.pool.engines.values())
    healthy = sum(e.healthy for e in engines)
    buffer = await state.store.problem()
    problems = []
    if not healthy:
        down = [f"{e.url}: {e.refused or e.failure or 'unhealthy'}{_since(e.down_since)}" for e in engines]
        problems.append("no healthy engine: " + ("; ".join(down) or "none was given (--engine)"))
    if buffer is not None:
        cause = f"{buffer['failure']}{_since(buffer['down_since'])}"
        problems.append(f"the buffer at {buffer['url']} is unreachable ({cause})")
    return {
        "ok": not problems,
        "healthy_engines": healthy,
        "problems": problems,
        "engines": [
            {"url": e.url, "healthy": e.healthy, "failure": e.refused or e.failure, "down_since": e.down_since}
            for e in engines
        ],
        "buffer": buffer,
    }


# Base URLs as agents are given them: OpenAI's ends in /v1, Anthropic's and Gemini's do not.
_BASES = ("", "/v1", "/v1beta")


def _install_base_urls(app: FastAPI) -> None:
    """`GET`/`HEAD` on a base URL answer 200: agent programs probe it before their first request
    (Claude Code sends `HEAD` to its base URL). A session's base URL says whether its key is open
    (401 unknown, 409 finished), so a misconfigured agent learns it before its first turn."""

    async def base(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    async def session_base(request: Request, api_key: str) -> JSONResponse:
        session_for_key(get_state(request), api_key)
        return JSONResponse({"ok": True})

    for path in _BASES:
        app.add_api_route(path or "/", base, methods=["GET", "HEAD"], include_in_schema=False)
        app.add_api_route("/s/{api_key}" + path, session_base, methods=["GET", "HEAD"], include_in_schema=False)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def log_config(access_log: bool) -> dict[str, Any]:
    """uvicorn's logging, with the router's own loggers on its stderr handler and every handler
    masking session keys (`RedactSecrets`): access lines and tracebacks carry `/s/<key>/` paths."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["filters"] = {"redact": {"()": RedactSecrets}}
    for handler in config["handlers"].values():
        handler["filters"] = ["redact"]
    config["loggers"]["uvicorn.error"]["level"] = "WARNING"
    config["loggers"]["uvicorn.access"]["level"] = "INFO" if access_log else "WARNING"
    config["loggers"]["slimeish"] = {"handlers": ["default"], "level": "WARNING", "propagate": False}
    return config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="slimeish router",
        description="OpenAI-compatible sessions in front of SGLang-protocol engines; every turn's exact "
        "tokens and log-probs are written to the buffer. See docs/router.md.",
    )
    add_dataclass_args(parser, RouterConfig, "router")
    args = parser.parse_args(argv)
    try:
        config = from_namespace(RouterConfig, args)
    except ValueError as e:
        parser.error(str(e))
    if not (config.admin_token or config.insecure_no_admin_token or _loopback(config.host)):
        parser.exit(
            2,
            f"{parser.prog}: error: --host {config.host} is reachable from other machines and --admin-token is unset: "
            "anyone could open and finish sessions or swap engines; set --admin-token, or --insecure-no-admin-token "
            "if that is intended\n",
        )
    logging.config.dictConfig(log_config(config.access_log))
    if config.buffer_url is not None:  # before serving: one last line naming it, not uvicorn's traceback
        try:
            asyncio.run(wait_for_buffer(config.buffer_url, config.buffer_connect_timeout))
        except BufferUnreachable as e:
            parser.exit(1, f"{parser.prog}: error: {e}\n")
    _raise_open_files(config.max_connections)
    app = create_app(config, freeze_gc=True)
    caps = ConnectionCaps(config.max_connections, config.max_connections_per_client)
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        log_config=log_config(config.access_log),
        # off, uvicorn still formats each request's client and quoted path for a logger that drops it
        access_log=config.access_log,
        timeout_keep_alive=config.timeout_keep_alive,
        http=functools.partial(GuardedProtocol, header_timeout=config.header_timeout, caps=caps),  # type: ignore[arg-type]
    )


# Files the router opens besides client connections: engines' and the buffer's connections, the model's files.
_OWN_FILES = 256


def _raise_open_files(max_connections: int) -> None:
    """Raise the soft limit on open files to what `--max-connections` needs (as SGLang raises
    it): at the usual 1024 the router would fail to accept (EMFILE) long before its cap."""
    if not max_connections:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max_connections + _OWN_FILES
    wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    if needed > wanted:
        logging.getLogger(__name__).warning(
            "open files are limited to %d (ulimit -n): fewer than --max-connections %d needs", wanted, max_connections
        )
