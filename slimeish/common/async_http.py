"""JSON over HTTP from rollout code: one `httpx.AsyncClient` per event loop (rollout calls run each
in its own thread and loop), and a POST that retries a server that cannot be reached yet."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

_clients: dict[int, httpx.AsyncClient] = {}


def loop_client() -> httpx.AsyncClient:
    """This event loop's client, created on first use."""
    loop = asyncio.get_running_loop()
    client = _clients.get(id(loop))
    if client is None or client.is_closed:
        client = _clients[id(loop)] = httpx.AsyncClient(timeout=None)
    return client


async def post(url: str, payload: dict[str, Any], max_retries: int = 60, headers: dict[str, str] | None = None) -> Any:
    """POST JSON and return the decoded answer; connection errors are retried (1 s apart), an
    HTTP error status is raised at once."""
    for attempt in range(max_retries + 1):
        try:
            r = await loop_client().post(url, json=payload, headers=headers)
        except httpx.TransportError:
            if attempt == max_retries:
                raise
            await asyncio.sleep(1)
            continue
        r.raise_for_status()
        return r.json()
    raise AssertionError("unreachable")
