"""slime's async HTTP helpers for plugins: `await post(url, payload)` returns the JSON answer."""

from __future__ import annotations

from typing import Any

from slimeish.common.async_http import loop_client, post

__all__ = ["get", "get_rollout_num_engines", "post"]


async def get(url: str) -> Any:
    r = await loop_client().get(url)
    r.raise_for_status()
    return r.json()


def get_rollout_num_engines(args: Any) -> int:
    """The engines behind the router (slime's name): `args.rollout_num_engines`."""
    return int(args.rollout_num_engines)
