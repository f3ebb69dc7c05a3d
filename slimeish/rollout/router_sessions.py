"""The one client of the router's session API: open, inspect, finish and abort sessions.

Both sides that end sessions use it: the rollout calls (`slimeish.rollout_functions.sessions`)
and `slimeish train`'s producer, which finishes the sessions a rollout function left open for it
to record. Every call rides out a router restart or a buffer outage (`send_retrying`), and every
call for a session goes to the router that opened it (a session lives on one router).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import tenacity

from slimeish.common.sample import Status

log = logging.getLogger(__name__)


class OnRouter(Protocol):
    """A session as far as ending it goes: its id and the router that holds it."""

    @property
    def session_id(self) -> str: ...
    @property
    def router_url(self) -> str: ...


@dataclass(frozen=True)
class SessionRef:
    session_id: str
    router_url: str


@dataclass(frozen=True)
class Session:
    session_id: str
    api_key: str
    base_url: str  # OpenAI base URL: http://ROUTER/s/<api_key>/v1
    router_url: str  # the router that opened it: every later call for the session goes there

    @property
    def generate_url(self) -> str:
        """The session's token-in endpoint (SGLang /generate body)."""
        return self.base_url.removesuffix("/v1") + "/generate"


class RouterUnavailable(RuntimeError):
    """The router answered 503 (its store or every engine is down for now): retry."""


def _retryable(e: BaseException) -> bool:
    return isinstance(e, (httpx.TransportError, RouterUnavailable))


async def send_retrying(
    client: httpx.AsyncClient, method: str, url: str, retry_s: float, stopping: threading.Event, **kwargs: Any
) -> httpx.Response:
    """One request, retried with backoff for up to `retry_s` while the router cannot be reached
    (restarting) or answers 503 (its buffer or engines are down for now), and until the run is
    `stopping`. Other answers are returned."""
    retrying = tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception(_retryable),
        wait=tenacity.wait_exponential(multiplier=0.2, max=5),
        stop=tenacity.stop_after_delay(retry_s) | tenacity.stop_when_event_set(stopping),
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            r = await client.request(method, url, **kwargs)
            if r.status_code == 503:
                raise RouterUnavailable(f"{method} {url}: 503 {r.text[:300]}")
            return r
    raise AssertionError("tenacity returns or raises")


class RouterSessions:
    """Sessions on the routers, with the admin token, over one shared HTTP client. Each new session
    goes to the router with the fewest sessions this object has open there, starting at router
    `first` among equals."""

    def __init__(
        self,
        router_urls: Sequence[str],
        admin_token: str | None,
        client: httpx.AsyncClient,
        *,
        retry_s: float,
        stopping: threading.Event,
        first: int = 0,
    ):
        if not router_urls:
            raise ValueError("RouterSessions needs at least one router URL")
        start = first % len(router_urls)
        urls = [u.rstrip("/") for u in router_urls]
        self.open_on = dict.fromkeys(urls[start:] + urls[:start], 0)  # min() takes the first of equals
        self._opened: set[str] = set()  # what it counts: a session another object opened is not
        self.headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.client = client
        self.retry_s = retry_s
        self.stopping = stopping

    async def send(self, method: str, url: str, *, admin: bool = True, **kwargs: Any) -> httpx.Response:
        """A request to a router, retried (`send_retrying`); `admin=False` for a session's own
        endpoints, which its URL authorizes."""
        headers = self.headers if admin else {}
        return await send_retrying(self.client, method, url, self.retry_s, self.stopping, headers=headers, **kwargs)

    async def open(
        self,
        group_id: str,
        index: int,
        group_size: int,
        metadata: dict[str, Any],
        *,
        trainable: bool = True,
        sampling_defaults: dict[str, Any] | None = None,
    ) -> Session:
        """`sampling_defaults` (SGLang names: `temperature`, `top_p`, `top_k`, `max_new_tokens`, `stop`) fill
        what the session's turns leave out."""
        body = {"group_id": group_id, "index": index, "group_size": group_size, "metadata": metadata}
        body |= {"trainable": trainable, "sampling_defaults": sampling_defaults or {}}
        router = min(self.open_on, key=self.open_on.__getitem__)
        self.open_on[router] += 1
        try:
            d = (await self.send("POST", f"{router}/sessions", json=body)).raise_for_status().json()
        except BaseException:
            self.open_on[router] -= 1
            raise
        self._opened.add(d["session_id"])
        return Session(d["session_id"], d["api_key"], d["base_url"], router)

    async def captured_turns(self, session: OnRouter) -> int:
        """How many turns the router captured on the session so far."""
        r = await self.send("GET", f"{session.router_url}/sessions/{session.session_id}")
        return int(r.raise_for_status().json()["turns"])

    async def _end(self, session: OnRouter, action: str, **body: Any) -> httpx.Response | None:
        """POST the session's `finish` or `abort`: the router's answer, or None if the router no
        longer knows the session (a restarted router closed it as aborted and queued its group
        place for regeneration, `--recover-open-sessions`)."""
        r = await self.send("POST", f"{session.router_url}/sessions/{session.session_id}/{action}", **body)
        if session.session_id in self._opened:
            self._opened.remove(session.session_id)
            self.open_on[session.router_url] -= 1
        if r.status_code == 404:
            log.warning("session %s was lost with a router restart; its place is generated again", session.session_id)
            return None
        return r

    async def finish(
        self, session: OnRouter, reward: float | None, status: Status, metadata: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """The finished session's summary; None if a restarted router lost it (see `_end`)."""
        body = {"reward": reward, "status": status.value, "metadata": metadata or {}}
        r = await self._end(session, "finish", json=body)
        return None if r is None else dict(r.raise_for_status().json())

    async def abort(self, session: OnRouter) -> bool:
        """Give up a session whose episode was lost to its infrastructure: the router seals it as
        aborted and the buffer frees its group place, for the member to be opened again. False if
        a restarted router lost it (see `_end`): its place comes back from the recovery's queue."""
        r = await self._end(session, "abort")
        if r is not None and r.status_code != 409:  # 409: sealed already, by an earlier attempt whose answer was lost
            r.raise_for_status()
        return r is not None
