"""The name for JSON the router passes on without a schema of its own: chat messages and tools as
the chat template takes them (any field a template reads is kept), request and response bodies,
engine payloads. Where the router reads fields, it reads them into typed records at the edge."""

from __future__ import annotations

from typing import Any

JSONObject = dict[str, Any]  # one decoded JSON object
TokenLogprob = list[Any]  # SGLang's `[logprob, token_id, text | null]` of one sampled token
