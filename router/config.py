"""`RouterConfig`: every flag of `slimeish router`, as one typed dataclass."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from slimeish.common.config import help_field


@dataclass(kw_only=True)
class RouterConfig:
    model: Path = help_field(help="model directory: its tokenizer and chat template render the prompts")
    renderer: str = help_field(
        "auto",
        help="chat format: auto (from the model's config and tokenizer), template (its Jinja template), "
        "qwen3, qwen3-coder, glm-4.5, llama3, deepseek-v3",
    )
    next_turn_prompt: Literal["auto", "sampled", "template"] = help_field(
        "auto",
        help="what the engine sees of earlier replies on a chat turn: sampled (their sampled tokens; an episode "
        "stays one sample), template (the chat template's rendering of the history, e.g. without old reasoning; "
        "a new segment where it does not extend what was sampled), auto (the family's choice: sampled)",
    )
    engine: list[str] = help_field([], help="engine base URL (SGLang protocol, or an SGLang/smg router); repeatable")
    return_routed_experts: bool = help_field(
        False,
        help="MoE: ask the engines for each token's experts (SGLang's return_routed_experts; an SGLang server needs "
        "--enable-return-routed-experts) and store them with the turns, for the trainer's routing replay",
    )
    lora_path: str | None = help_field(
        None,
        help="LoRA runs: every generation asks the engines for this loaded LoRA adapter (SGLang's lora_path; "
        "`slimeish train --lora-rank` sets it to its --lora-name, the name its weight sync loads the adapter "
        "under); a session opened with its own lora_path samples with that one (default: None: the base weights)",
    )
    buffer_url: str | None = help_field(None, help="redis:// URL of the data buffer; without it turns stay in memory")
    run_id: str = help_field("default", help="run id under which the buffer stores this run")
    router_id: str = help_field(
        "",
        help="this router's name among the run's routers; the sessions it opens record it, so that its "
        "--recover-open-sessions closes only its own (set by `slimeish train`: router, or router0, router1, ...)",
    )
    recover_open_sessions: bool = help_field(
        False,
        help="on start, close the run's open sessions in the buffer as aborted and queue their places for "
        "regeneration: a router that died held them (set by `slimeish train`); with --router-id only the "
        "sessions of that id, so several routers can share a run",
    )
    buffer_connect_timeout: float = help_field(
        60.0,
        help="seconds the router tries to reach --buffer-url at start-up (a log line per failed attempt) "
        "before it exits with one line naming it",
    )
    store_timeout: float = help_field(
        5.0,
        help="seconds a buffer write may take before the request is answered 503 store_unavailable "
        "(a turn answered so is never stored; a create or finish sent again gets the same result)",
    )
    admin_token: str | None = help_field(None, help="bearer token for /admin and /sessions; unset = no auth there")
    host: str = help_field(
        "127.0.0.1", help="address to bind; another than loopback needs --admin-token (or --insecure-no-admin-token)"
    )
    insecure_no_admin_token: bool = help_field(
        False,
        help="serve /sessions and /admin without a token on a non-loopback --host (anyone reaching it may use them)",
    )
    port: int = help_field(30010, help="port to bind")
    allow_anonymous: bool = help_field(False, help="serve /v1 requests without a session (answered, never logged)")
    served_model_name: str | None = help_field(None, help="model id shown in /v1/models (default: the model dir name)")
    max_body_bytes: int = help_field(
        32 * 2**20, help="largest request body in bytes, checked before it is read whole (413 beyond)"
    )
    header_timeout: float = help_field(
        10.0,
        help="seconds a connection has to send a request's line and headers (from its opening, or a later "
        "request's first byte) before it is closed; only `slimeish router` (the process) applies it",
    )
    body_timeout: float = help_field(
        30.0, help="seconds a request's whole body has to arrive after its headers (408 and the connection closed)"
    )
    max_connections: int = help_field(
        8192,
        help="most connections open at once; one opened beyond it is answered 503 too_many_connections and closed "
        "(those open are served on); 0 = no cap; only `slimeish router` (the process) applies it",
    )
    max_connections_per_client: int = help_field(
        0,
        help="most connections open at once from one client address (503 beyond, as --max-connections); 0 = no cap: "
        "agents on the router's machine share one loopback address, so set it when clients are other machines",
    )
    timeout_keep_alive: int = help_field(
        75,
        help="seconds an idle kept-alive connection is held after a response before it is closed (uvicorn's "
        "--timeout-keep-alive; above agents' clients' own 5 s, so the router is not the side that closes "
        "a connection as a request is sent on it)",
    )
    max_messages: int = help_field(
        10_000, help="most messages (Responses: input items) in one request, checked before validation (400 beyond)"
    )
    default_max_tokens: int = help_field(2048, help="max new tokens when a request sets none (capped by context)")
    context_length: int | None = help_field(None, help="context window in tokens (default: from the model config)")
    health_interval: float = help_field(2.0, help="seconds between engine health checks")
    health_check_timeout: float = help_field(5.0, help="seconds an engine has to answer one health check")
    health_failure_threshold: int = help_field(
        3,
        help="health checks in a row an engine may answer late or not 200 before it is ejected "
        "(one that refuses the connection is ejected at once)",
    )
    request_timeout: float = help_field(600.0, help="seconds to wait for one engine /generate call")
    engine_retries: int = help_field(2, help="other engines tried when an engine cannot be reached (not on errors)")
    finish_timeout: float = help_field(
        30.0, help="seconds a session finish waits for the session's generating turns to be recorded"
    )
    stream_keepalive: float = help_field(
        5.0,
        help="seconds without an event after which a stream sends one its client decodes (ping), through the "
        "prefill too: a stream whose first token is this late opens and keeps alive; 0 = never",
    )
    access_log: bool = help_field(False, help="log every request (method, path, status) to stderr, session keys masked")
    keep_finished: int = help_field(10_000, help="finished sessions whose summary GET /sessions/{id} still returns")
