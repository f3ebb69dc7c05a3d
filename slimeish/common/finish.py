"""Why a generation stopped, in each vocabulary that needs it, mapped in one place.

Engines report SGLang's `meta_info.finish_reason.type`: "stop" (a stop token or string),
"length" (`max_new_tokens` or the context) or "abort" (the system stopped it). The router answers
in OpenAI's words and the rollout side records a `Sample.Status`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from slimeish.common.sample import Status

FinishType = Literal["stop", "length", "abort"]
OpenAIFinishReason = Literal["stop", "length", "tool_calls"]

_STATUS: dict[str, Status] = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}


def finish_type(meta_info: Mapping[str, Any]) -> str | None:
    """The `type` of an SGLang `meta_info.finish_reason` (None while a stream is still running)."""
    reason = meta_info.get("finish_reason")
    return reason.get("type") if isinstance(reason, dict) else None


def openai_finish_reason(finish: str | None, *, tool_calls: bool = False) -> OpenAIFinishReason:
    """OpenAI's `finish_reason`: a reply that calls tools says so; an abort reads as a stop, since
    OpenAI has no word for it and the turn's text is whole up to where it ended."""
    if tool_calls:
        return "tool_calls"
    return "length" if finish == "length" else "stop"


def sample_status(finish: str | None) -> Status:
    """The status of a sample whose last generation ended this way (unknown: completed)."""
    return _STATUS.get(finish or "stop", Status.COMPLETED)
