"""OpenAI response bodies and SSE chunks built from engine generations."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from fastapi.responses import Response

from slimeish.common.finish import openai_finish_reason
from slimeish.router.jsontypes import JSONObject, TokenLogprob
from slimeish.router.renderers.base import Renderer
from slimeish.router.turns import Generation


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status, media_type="application/json")


def new_id(prefix: str) -> str:
    """A fresh id after `prefix`, which carries the API's own separator (`chatcmpl-`, `msg_`)."""
    return prefix + uuid.uuid4().hex


def stream_head(model: str, prefix: str, obj: str) -> dict[str, Any]:
    return {"id": new_id(prefix + "-"), "object": obj, "created": int(time.time()), "model": model}


def usage(prompt_tokens: int, gens: list[Generation]) -> dict[str, int]:
    completion = sum(len(g.output_ids) for g in gens)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def _token_entry(renderer: Renderer, token_id: int, logprob: float) -> dict[str, Any]:
    text = renderer.token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def stream_logprobs(renderer: Renderer, entries: list[TokenLogprob]) -> dict[str, Any]:
    """Chat log-probs of the tokens in one stream chunk (`[logprob, token_id, text]` entries)."""
    return {"content": [{**_token_entry(renderer, e[1], e[0]), "top_logprobs": []} for e in entries]}


def chat_logprobs(renderer: Renderer, gen: Generation) -> dict[str, Any]:
    """OpenAI's shape; `top_logprobs` come from SGLang's `output_top_logprobs` when the engine
    returned them (`[logprob, token_id, text]` per alternative)."""
    tops = gen.top_logprobs or [None] * len(gen.output_ids)
    return {
        "content": [
            {
                **_token_entry(renderer, token, lp),
                "top_logprobs": [_token_entry(renderer, alt[1], alt[0]) for alt in top or []],
            }
            for token, lp, top in zip(gen.output_ids, gen.logprobs, tops, strict=True)
        ]
    }


def completion_logprobs(renderer: Renderer, gen: Generation) -> dict[str, Any]:
    texts = renderer.tokenizer.batch_decode([[t] for t in gen.output_ids])
    offsets, at = [], 0
    for t in texts:
        offsets.append(at)
        at += len(t)
    return {"tokens": texts, "token_logprobs": gen.logprobs, "top_logprobs": None, "text_offset": offsets}


def chat_completion(
    model: str,
    messages: list[JSONObject],
    gens: list[Generation],
    prompt_tokens: int,
    logprobs: list[JSONObject] | None,
) -> dict[str, Any]:
    choices = [
        {
            "index": i,
            "message": message,
            "logprobs": logprobs[i] if logprobs else None,
            "finish_reason": openai_finish_reason(gen.finish_type, tool_calls=bool(message.get("tool_calls"))),
        }
        for i, (gen, message) in enumerate(zip(gens, messages, strict=True))
    ]
    return {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, gens),
    }


def text_completion(
    model: str, texts: list[str], gens: list[Generation], prompt_tokens: int, logprobs: list[JSONObject] | None
) -> dict[str, Any]:
    choices = [
        {
            "index": i,
            "text": text,
            "logprobs": logprobs[i] if logprobs else None,
            "finish_reason": openai_finish_reason(gen.finish_type),
        }
        for i, (gen, text) in enumerate(zip(gens, texts, strict=True))
    ]
    return {
        "id": new_id("cmpl-"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, gens),
    }
