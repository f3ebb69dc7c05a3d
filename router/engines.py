"""The engines as the pool knows them: each one's health, load and the weight versions it serves;
the weight updates and what each one changes (the base weights, or one LoRA adapter)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from slimeish.router.engine_api import Answer, GenerateReply
from slimeish.router.jsontypes import JSONObject

# The engine calls that change the weights a version serves (a LoRA run's: its adapter's).
UpdatePath = Literal["/update_weights_from_disk", "/update_weights_from_tensor", "/load_lora_adapter"]
UPDATE_PATHS: tuple[str, ...] = get_args(UpdatePath)


@dataclass(frozen=True)
class WeightUpdate:
    """The last update the engines took: replayed to an engine that comes back behind it."""

    path: str  # one of UPDATE_PATHS
    body: JSONObject
    version: int

    @property
    def adapter(self) -> str | None:
        return update_target(self.path, self.body)


def update_target(path: str, body: Mapping[str, Any]) -> str | None:
    """What an update (or unload) changes: the LoRA adapter it names, or None for the base weights."""
    name = body.get("lora_name") if path in ("/load_lora_adapter", "/unload_lora_adapter") else None
    return name if isinstance(name, str) else None


@dataclass
class Engine:
    url: str
    healthy: bool = True
    inflight: int = 0
    sessions: int = 0
    weight_version: int | None = None  # of the base weights
    adapter_versions: dict[str, int] = field(default_factory=dict)  # of each LoRA adapter it serves
    lists_adapters: bool = False  # its /model_info lists its adapters (the embedded engine's; SGLang's does not)
    refused: str | None = None  # why the engine is kept out of the pool until it is added again
    version_checked: bool = False
    failed_checks: int = 0  # health checks in a row it answered late or not 200
    failure: str | None = None  # its last failure (a request or health check), while it is unhealthy
    down_since: float | None = None  # when it became unhealthy (time.time())

    def as_dict(self) -> JSONObject:
        keys = ("url", "healthy", "inflight", "sessions", "weight_version", "adapter_versions", "refused")
        return {k: getattr(self, k) for k in keys}

    def version(self, adapter: str | None) -> int | None:
        """The version it serves of the base weights (None) or of a LoRA adapter (None: not loaded)."""
        return self.weight_version if adapter is None else self.adapter_versions.get(adapter)

    def note_version(self, adapter: str | None, version: int) -> None:
        if adapter is None:
            self.weight_version = version
        else:
            self.adapter_versions[adapter] = version


def set_health(engine: Engine, healthy: bool, failure: str) -> None:
    """Mark `engine` healthy or not; an unhealthy one keeps the failure and when it went down."""
    if healthy:
        engine.failure = engine.down_since = None
    else:
        engine.failure = failure
        engine.down_since = engine.down_since if not engine.healthy and engine.down_since else time.time()
    engine.healthy = healthy


def refused_by_all(results: list[JSONObject]) -> bool:
    """A fan-out that engines answered with errors and none took: the call itself is bad (a
    payload no engine can load), unlike engines that were down, which are skipped."""
    return not took(results) and any("status_code" in r for r in results)


def took(results: list[JSONObject]) -> bool:
    return any(r["ok"] for r in results)


def note_answer_version(engine: Engine, answer: Answer, payload: Mapping[str, Any]) -> None:
    """An answer carries the version the engine serves now of what it sampled with: the base weights,
    or the request's LoRA adapter (a batch of several adapters says nothing of one)."""
    first: GenerateReply = (answer[0] if answer else {}) if isinstance(answer, list) else answer
    meta = first.get("meta_info", {})
    if (meta.get("finish_reason") or {}).get("type") == "abort":
        return  # an abort (its adapter unloaded under it) sampled nothing: its version says nothing
    adapter = payload.get("lora_path")
    version = meta.get("weight_version")
    if version is not None and (adapter is None or isinstance(adapter, str)):
        engine.note_version(adapter, int(version))  # SGLang sends it as a string
