"""Test helper: check `/generate` bodies and responses against SGLang's own published schema.

SGLang's wheel ships the msgspec schema of its HTTP API (`sglang/api/v1/api_types.py`, generated
from the same definitions as its Rust server). Importing it needs only `msgspec`, so tests of any
part (the engine's responses, what the router sends to engines) can hold our messages to the
real contract. The sglang module is imported lazily: it is a test-time dependency only.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any


class SchemaError(ValueError):
    """A message that SGLang's schema rejects, or that lacks what the slimeish contract needs."""


@functools.cache
def _api() -> ModuleType:
    """Load `sglang/api/v1/api_types.py` by file: `import sglang` would pull in its CUDA runtime."""
    spec = importlib.util.find_spec("sglang")  # locates the package without executing its __init__
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("SGLang's schema needs the sglang wheel: pip install --no-deps sglang")
    path = Path(spec.submodule_search_locations[0]) / "api" / "v1" / "api_types.py"
    module_spec = importlib.util.spec_from_file_location("_sglang_api_types", path)
    if module_spec is None or module_spec.loader is None:
        raise RuntimeError(f"cannot load SGLang's schema from {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module  # msgspec resolves the Structs' forward references here
    module_spec.loader.exec_module(module)
    return module


def validate_generate_request(body: dict) -> Any:
    """Decode a `/generate` request body as SGLang's server would; returns its `GenerateRequest`."""
    api = _api()
    try:
        return api.GenerateRequest.from_json_value(body)
    except api.JsonContractError as e:
        raise SchemaError(f"/generate request rejected by SGLang's schema: {e}") from None


def validate_generate_response(obj: dict | list) -> list[Any]:
    """Decode a `/generate` response (one object or a batch list, or one stream chunk).

    Beyond the schema (which ignores missing keys), requires what slimeish consumers read:
    `text`, `output_ids` and `meta_info` with `id`, `finish_reason` and `weight_version`.
    """
    api = _api()
    items = obj if isinstance(obj, list) else [obj]
    decoded = []
    for item in items:
        if not isinstance(item, dict):
            raise SchemaError(f"response item must be an object, got {type(item).__name__}")
        missing = [k for k in ("text", "output_ids", "meta_info") if k not in item]
        meta = item.get("meta_info", {})
        missing += [f"meta_info.{k}" for k in ("id", "finish_reason", "weight_version") if k not in meta]
        if missing:
            raise SchemaError(f"/generate response lacks {missing}")
        try:
            decoded.append(api.GenerateResponse.from_json_value(item))
        except api.JsonContractError as e:
            raise SchemaError(f"/generate response rejected by SGLang's schema: {e}") from None
    return decoded


def parse_sse(lines: Iterable[str]) -> list[dict]:
    """The JSON chunks of a streamed `/generate` answer; checks it ends with `data: [DONE]`."""
    events = [line[len("data:") :].strip() for line in lines if line.startswith("data:")]
    if not events or events[-1] != "[DONE]":
        raise SchemaError("stream did not end with 'data: [DONE]'")
    return [json.loads(e) for e in events[:-1]]
