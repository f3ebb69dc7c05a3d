"""Where the router writes sessions and turns: the Redis buffer, or memory when there is none.

`TurnStore` is the one seam between capture and storage. `BufferStore` writes through to
`buffer.Buffer` (the records and the Redis schema belong to the buffer); `MemoryStore` keeps
records in this process for `slimeish router` without `--buffer-url` and for tests, building
samples with the buffer's own segment rules.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any, Protocol
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from slimeish.buffer import Buffer, SessionInfo, Turn, build_samples
from slimeish.common.sample import Sample, Status
from slimeish.router.jsontypes import JSONObject

log = logging.getLogger(__name__)

# Failures to reach the store (not refusals of the input): the write may be retried.
STORE_ERRORS: tuple[type[Exception], ...] = (RedisError, OSError)


class StoreUnavailable(RuntimeError):
    """The store could not be reached (e.g. Redis is down): nothing changed, the write may be retried."""

    def __init__(self, what: str, cause: BaseException):
        super().__init__(f"{what} could not be stored ({type(cause).__name__}); nothing changed: retry")
        self.what = what


class BufferUnreachable(RuntimeError):
    """The buffer did not answer within the start-up bound (`wait_for_buffer`)."""


def shown_url(url: str) -> str:
    """`url` as it may be logged: a password in it masked."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")  # the netloc as written: its password may be %-encoded
    return parts._replace(netloc=f"{userinfo.partition(':')[0]}:<redacted>@{host}").geturl()


async def ping(url: str, timeout: float) -> str | None:
    """None if the Redis server at `url` answers PING within `timeout` seconds, else why not (one
    try on a connection of its own: the buffer client's would retry with backoff)."""
    probe = Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout, retry=Retry(NoBackoff(), 0))
    try:
        await probe.ping()
        return None
    except (RedisError, OSError) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        await probe.aclose()


async def wait_for_buffer(url: str, timeout: float, every: float = 2.0) -> None:
    """Return once the Redis server at `url` answers PING. Each failed attempt (at most `every`
    seconds, then `every` seconds apart) is logged; BufferUnreachable once `timeout` seconds passed."""
    started = time.monotonic()
    for attempt in range(1, 1_000_000):
        if (cause := await ping(url, every)) is None:
            return
        waited = time.monotonic() - started
        if waited + every > timeout:
            raise BufferUnreachable(
                f"the buffer at {shown_url(url)} did not answer for {waited:.0f} s ({cause}): "
                "start it or fix --buffer-url"
            )
        log.warning("the buffer at %s is unreachable (attempt %d: %s); trying again", shown_url(url), attempt, cause)
        await asyncio.sleep(every)


class TurnStore(Protocol):
    async def open_session(self, info: SessionInfo) -> None: ...
    async def append_turn(self, turn: Turn, epoch: int) -> None: ...
    async def revoke_turns(self, session_id: str, from_index: int, epoch: int) -> None: ...
    async def finish_session(
        self, session_id: str, reward: float | None, status: Status, metadata: dict[str, Any]
    ) -> None: ...
    async def abort_session(self, session_id: str) -> bool: ...
    async def close(self) -> None: ...
    async def problem(self) -> JSONObject | None: ...


# Seconds `/health` waits for the buffer's answer to a PING.
HEALTH_PING_S = 2.0


class BufferStore:
    """Write-through to the Redis buffer: each turn is durable as soon as it completes.

    A write not confirmed within `timeout` seconds raises TimeoutError (a `STORE_ERRORS`), so a
    stalled store is answered 503 instead of holding the request. The write may still land
    later; every write is idempotent in the buffer, and the router sends the same one again."""

    def __init__(self, buffer: Buffer, timeout: float, url: str = ""):
        self.buffer, self.timeout, self.url = buffer, timeout, url
        self.unreachable_since: float | None = None  # time.time() of the first failed `problem` in a row

    @classmethod
    async def connect(
        cls,
        url: str,
        run_id: str,
        timeout: float,
        recover: bool = False,
        owner: str = "",
        connect_timeout: float = 60.0,
    ) -> BufferStore:
        """`recover`: close the sessions a dead router left open (aborted) and queue their group
        places for regeneration, before this one serves: its agents lost their sessions with it.
        With an `owner` (this router's id) only that router's sessions: other routers' live on.
        An unreachable buffer is tried for `connect_timeout` seconds (`wait_for_buffer`)."""
        await wait_for_buffer(url, connect_timeout)  # fail at start-up, not at the first turn
        buffer = Buffer(url, run_id)
        if recover and (requests := await buffer.recover_open_groups(owner or None)):
            places = sum(len(r.indices) for r in requests)
            log.warning("closed the sessions a previous router left open: %d group places to regenerate", places)
        return cls(buffer, timeout, url)

    async def open_session(self, info: SessionInfo) -> None:
        await asyncio.wait_for(self.buffer.open_session(info), self.timeout)

    async def append_turn(self, turn: Turn, epoch: int) -> None:
        await asyncio.wait_for(self.buffer.append_turn(turn, epoch), self.timeout)

    async def revoke_turns(self, session_id: str, from_index: int, epoch: int) -> None:
        await asyncio.wait_for(self.buffer.revoke_turns(session_id, from_index, epoch), self.timeout)

    async def finish_session(self, session_id: str, reward: float | None, status: Status, metadata: JSONObject) -> None:
        await asyncio.wait_for(self.buffer.finish_session(session_id, reward, status, metadata), self.timeout)

    async def abort_session(self, session_id: str) -> bool:
        return await asyncio.wait_for(self.buffer.abort_session(session_id), self.timeout)

    async def close(self) -> None:
        await self.buffer.aclose()

    async def problem(self) -> JSONObject | None:
        """None while the buffer answers a PING, else what `/health` says of it."""
        if (cause := await ping(self.url, HEALTH_PING_S)) is None:
            self.unreachable_since = None
            return None
        self.unreachable_since = self.unreachable_since or time.time()
        return {"url": shown_url(self.url), "failure": cause, "down_since": self.unreachable_since}


class MemoryStore:
    """Records kept in this process; `samples(session_id)` builds what the buffer would. Like the
    router's finished-session summaries, only the most recent `keep_finished` finished sessions
    are kept (older ones are forgotten whole); open sessions always are."""

    def __init__(self, keep_finished: int = 10_000) -> None:
        self.keep_finished = keep_finished
        self.sessions: dict[str, SessionInfo] = {}
        self.turns: dict[str, list[Turn]] = {}
        self.finished: OrderedDict[str, tuple[float | None, Status, dict[str, Any]]] = OrderedDict()

    async def open_session(self, info: SessionInfo) -> None:
        self.sessions[info.session_id] = info
        self.turns.setdefault(info.session_id, [])  # opening again (a retry) keeps what it has

    async def append_turn(self, turn: Turn, epoch: int) -> None:
        turn.validate()
        turns = self.turns[turn.session_id]
        if turn.turn_index < len(turns):  # a retried write, stored once as the buffer does
            return
        turns.append(turn)

    async def revoke_turns(self, session_id: str, from_index: int, epoch: int) -> None:
        del self.turns[session_id][from_index:]

    async def finish_session(self, session_id: str, reward: float | None, status: Status, metadata: JSONObject) -> None:
        self.finished[session_id] = (reward, status, metadata)
        while len(self.finished) > self.keep_finished:
            old, _ = self.finished.popitem(last=False)
            self.sessions.pop(old, None)
            self.turns.pop(old, None)

    async def abort_session(self, session_id: str) -> bool:
        """Closed as aborted, as the buffer does (no group places are kept here to free)."""
        if session_id not in self.sessions or session_id in self.finished:
            return False
        await self.finish_session(session_id, None, Status.ABORTED, {})
        return True

    async def close(self) -> None:
        pass

    async def problem(self) -> JSONObject | None:
        return None

    def samples(self, session_id: str) -> list[Sample]:
        """The samples the buffer would build (log-probs stored as float32, as there)."""
        info = self.sessions[session_id]
        reward, status, metadata = self.finished.get(session_id, (None, Status.COMPLETED, {}))
        packed = build_samples(
            [t.pack() for t in self.turns[session_id]],
            status=status,
            index=info.index,
            group_index=0,
            metadata={**info.metadata, **metadata},
        )
        return [p.to_sample(reward) for p in packed]
