"""The router's root `POST /generate`, in SGLang's native shape, as slime's router serves it.

slime plugins that call the engine themselves post to `http://{sglang_router_ip}:{sglang_router_port}/generate`
with `text` or `input_ids`, `sampling_params` and `return_logprob`. This path forwards the body to
an engine and returns its answer unchanged; nothing is captured (no session): such samples are
recorded from what the plugin returns (docs/rollout.md). The session path `/s/<key>/generate`
keeps capturing.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from slimeish.router import openai_bodies as R
from slimeish.router.errors import APIError
from slimeish.router.pipeline import read_json
from slimeish.router.schemas import check_n
from slimeish.router.state import get_state


async def engine_generate(request: Request, api_key: str | None) -> Response:
    state, body = get_state(request), await read_json(request)
    if (body.get("text") is None) == (body.get("input_ids") is None):
        raise APIError(400, "/generate takes exactly one of `text` (a string) or `input_ids` (a list of ints)")
    if body.get("stream"):
        raise APIError(400, "stream is not supported on the router's /generate", param="stream")
    if not isinstance(body.get("sampling_params", {}), dict):
        raise APIError(400, "sampling_params must be a JSON object", param="sampling_params")
    check_n(body.get("sampling_params", {}))
    answer, _ = await state.pool.generate(body, None)
    return R.json_response(answer)
