"""Limits that keep one bad request from stalling the router: checked before the costly work.

The body size is checked before the body is read whole (its `Content-Length`, then the bytes as
they arrive), the message count right after the JSON is parsed (before any validation), and the
context window before the prompt is rendered and tokenized, from a lower bound on its tokens:
no token of the tokenizer spells more than `max_token_chars` characters, so text of C characters
takes at least C / max_token_chars tokens; a large prompt that passes that bound has its messages'
tokens counted on a worker thread (with the GIL released) before it is rendered, so `/health` and
every other session keep being answered meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from tokenizers import Tokenizer

from slimeish.router.errors import APIError

T = TypeVar("T")
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

# Roles whose content every chat template renders verbatim (an assistant's may be cut: templates
# drop earlier turns' reasoning), so their characters are in the prompt.
_VERBATIM_ROLES = frozenset({"system", "developer", "user", "tool"})
# Prompts with more characters than this are counted and planned on a worker thread: ~0.1 s of
# tokenization (measured: 2.4M characters take ~2 s), below which the thread hop costs more than it frees.
OFF_LOOP_CHARS = 200_000


def too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"the request body is over the router's limit of {limit} bytes (--max-body-bytes)",
        code="request_too_large",
    )


def declared_too_large(headers: list[tuple[bytes, bytes]], limit: int) -> bool:
    """Whether the request's `Content-Length` is over `limit` (a body sent in chunks is counted by `capped`)."""
    for name, value in headers:
        if name == b"content-length":
            return value.isdigit() and int(value) > limit
    return False


def capped(receive: Receive, limit: int, body_timeout: float) -> Receive:
    """`receive`, raising a 413 `APIError` once the body's bytes pass `limit`, and a 408 (with
    `Connection: close`) when the whole body has not arrived `body_timeout` seconds after the
    request's head: a client trickling its body holds no connection longer. Once the body is in,
    `receive` (a wait for the client's disconnect) is not bounded."""
    seen, body_done = 0, False
    deadline = asyncio.get_running_loop().time() + body_timeout

    async def counted() -> MutableMapping[str, Any]:
        nonlocal seen, body_done
        if body_done:
            return await receive()
        try:
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError:
            raise APIError(
                408,
                f"the request body did not arrive within {body_timeout:g} s (--body-timeout)",
                code="request_timeout",
                headers={"Connection": "close"},
            ) from None
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise too_large(limit)
            body_done = not message.get("more_body", False)
        return message

    return counted


def check_message_count(body: dict[str, Any], limit: int) -> None:
    """A 400 when the conversation (`messages`, or the Responses API's `input`) has over `limit` items."""
    for field in ("messages", "input"):
        items = body.get(field)
        if isinstance(items, list) and len(items) > limit:
            raise APIError(
                400,
                f"{field} has {len(items)} items; the router takes at most {limit} (--max-messages)",
                param=field,
                code="too_many_messages",
            )


def max_token_chars(vocab: dict[str, int]) -> int:
    """The most characters one token can spell: the longest vocabulary entry (byte-level BPE
    writes one character per byte, so this bounds the decoded characters from above)."""
    return max(map(len, vocab), default=1) or 1


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def verbatim_texts(messages: list[Any]) -> list[str]:
    """The message texts that the prompt holds verbatim (whitespace at the ends aside)."""
    texts = (
        _text(m.get("content")).strip() for m in messages if isinstance(m, dict) and m.get("role") in _VERBATIM_ROLES
    )
    return [t for t in texts if t]


def _exceeded(context_length: int, floor: int, how: str) -> APIError:
    return APIError(
        400,
        f"this model's maximum context length is {context_length} tokens; the prompt has at least {floor} ({how})",
        param="messages",
        code="context_length_exceeded",
    )


async def check_context(texts: list[str], tokenizer: Tokenizer | None, token_chars: int, context_length: int) -> None:
    """A 400 `context_length_exceeded` when `texts` cannot fit in the context, told before the
    prompt is rendered: at once from their characters, else, when they are large, from their
    tokens counted on a worker thread (`Tokenizer.encode_batch` releases the GIL, so the event
    loop goes on meanwhile; `encode` would hold it). Counted piece by piece, a text may take a
    token or two more than inside the prompt, where a neighbour can merge with its ends."""
    chars = sum(map(len, texts))
    if (floor := chars // token_chars) > context_length:
        raise _exceeded(context_length, floor, f"{chars} characters")
    if tokenizer is None or chars <= OFF_LOOP_CHARS:
        return
    encodings = await asyncio.to_thread(tokenizer.encode_batch, texts, add_special_tokens=False)
    if (floor := sum(len(e.ids) - 2 for e in encodings)) > context_length:
        raise _exceeded(context_length, floor, "its messages' tokens")


async def off_loop_if_large(chars: int, work: Callable[[], T]) -> T:
    """`work()`, on a worker thread when the prompt is large (see `OFF_LOOP_CHARS`): rendering
    it there leaves the loop free, and so will tokenizing once that releases the GIL."""
    if chars > OFF_LOOP_CHARS:
        return await asyncio.to_thread(work)
    return work()
