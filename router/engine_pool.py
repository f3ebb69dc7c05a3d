"""Engines behind the router: sticky placement, least-loaded choice, health checks, retries.

An engine is any server speaking SGLang's native HTTP protocol (an SGLang server, the embedded
engine, or an SGLang/smg router in front of several). A session sticks to one engine so its
prefix stays in that engine's cache; a request whose engine cannot be reached is retried
on another healthy engine (at most `retries` times), and the failed one is ejected until a health
check re-admits it. An engine that answers with an error or times out fails only that request: a
poison request or a long generation must not empty the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import orjson

log = logging.getLogger(__name__)


class NoEngineError(RuntimeError):
    """No healthy engine could serve the request (an HTTP 503 for the client)."""


class EngineRejected(ValueError):
    """The engine answered 4xx: the request itself is bad (an HTTP 400 for the client)."""


class EngineError(RuntimeError):
    """The engine failed this one request (5xx answer, timeout): 502/504 for the client, no retry."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


# Failures before the engine saw the request (refused, reset, dropped keep-alive): safe to retry.
UNREACHABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def _check_status(engine: Engine, status: int, text: str) -> None:
    if status >= 500:
        raise EngineError(502, f"engine {engine.url} answered HTTP {status}: {text[:300]}")
    if status >= 400:
        raise EngineRejected(f"engine rejected the request: {text[:500]}")


class EngineFailedMidStream(RuntimeError):
    """The engine failed after output was already sent to the client: no retry is possible."""


@dataclass
class Engine:
    url: str
    healthy: bool = True
    inflight: int = 0
    sessions: int = 0
    weight_version: str | None = None
    refused: str | None = None  # why the engine is kept out of the pool until it is added again
    version_checked: bool = False

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("url", "healthy", "inflight", "sessions", "weight_version", "refused")}


class EnginePool:
    def __init__(self, client: httpx.AsyncClient, urls: list[str], timeout: float, retries: int = 2):
        self.client = client
        self.timeout = timeout
        self.retries = retries  # other engines tried after one cannot be reached
        self.engines: dict[str, Engine] = {}
        for url in urls:
            self.add(url)

    def add(self, url: str) -> Engine:
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"engine URL must start with http:// or https://, got {url!r}")
        return self.engines.setdefault(url, Engine(url))

    async def admit(self, url: str) -> Engine:
        """Add an engine (or re-check a known one) now; ValueError if its weight version is unusable."""
        engine = self.add(url)
        engine.refused, engine.version_checked = None, False
        await self._check(engine)
        if engine.refused:
            self.remove(engine.url)
            raise ValueError(engine.refused)
        return engine

    def remove(self, url: str) -> None:
        if self.engines.pop(url.rstrip("/"), None) is None:
            raise KeyError(url)

    def release(self, url: str | None) -> None:
        """A session placed on `url` finished: it no longer counts toward that engine's load."""
        engine = self.engines.get(url) if url else None
        if engine is not None:
            engine.sessions = max(0, engine.sessions - 1)

    def move(self, old: str | None, new: str) -> None:
        """A session is now placed on `new` (first turn, or failover from `old`)."""
        if old != new:
            self.release(old)
            self.engines[new].sessions += 1

    def pick(self, sticky: str | None, exclude: set[str] = frozenset()) -> Engine:
        """The session's engine if it is healthy, else the least-loaded healthy engine."""
        engine = self.engines.get(sticky) if sticky else None
        if engine is not None and engine.healthy and engine.url not in exclude:
            return engine
        candidates = [e for e in self.engines.values() if e.healthy and e.url not in exclude]
        if not candidates:
            raise NoEngineError("no healthy engine is available")
        return min(candidates, key=lambda e: (e.inflight, e.sessions))

    async def generate(self, payload: dict, sticky: str | None) -> tuple[dict, Engine]:
        """POST /generate, retried on another engine only when one cannot be reached."""
        body = orjson.dumps(payload)
        tried: list[str] = []
        for _ in range(self.retries + 1):
            engine = self.pick(sticky, set(tried))
            tried.append(engine.url)
            engine.inflight += 1
            try:
                response = await self.client.post(
                    engine.url + "/generate",
                    content=body,
                    headers={"content-type": "application/json"},
                    timeout=self.timeout,
                )
            except UNREACHABLE as e:
                self._eject(engine, repr(e))
                continue
            except httpx.TransportError as e:
                raise self._failed(engine, e) from e
            finally:
                engine.inflight -= 1
            _check_status(engine, response.status_code, response.text)
            data = orjson.loads(response.content)
            first = data[0] if isinstance(data, list) and data else data
            engine.weight_version = first.get("meta_info", {}).get("weight_version", engine.weight_version)
            return data, engine
        raise NoEngineError(f"no engine could be reached (tried {', '.join(tried)})")

    async def stream(self, payload: dict, sticky: str | None) -> AsyncIterator[tuple[dict, Engine]]:
        """POST /generate with `stream: true`, yielding SGLang chunks; an engine that cannot be
        reached is ejected and the request retried on another one."""
        body = orjson.dumps({**payload, "stream": True})
        tried: list[str] = []
        for _ in range(self.retries + 1):
            engine = self.pick(sticky, set(tried))
            tried.append(engine.url)
            engine.inflight += 1
            started = False
            try:
                async with self.client.stream(
                    "POST", engine.url + "/generate", content=body, headers={"content-type": "application/json"},
                    timeout=self.timeout,
                ) as response:  # fmt: skip
                    if response.status_code >= 400:
                        _check_status(engine, response.status_code, (await response.aread()).decode(errors="replace"))
                    async for line in response.aiter_lines():
                        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                            continue
                        started = True
                        yield orjson.loads(line[5:]), engine
                    return
            except httpx.TransportError as e:
                if started:
                    raise EngineFailedMidStream(f"engine {engine.url} failed mid-stream: {e!r}") from e
                if not isinstance(e, UNREACHABLE):
                    raise self._failed(engine, e) from e
                self._eject(engine, repr(e))
            finally:
                engine.inflight -= 1
        raise NoEngineError(f"no engine could be reached (tried {', '.join(tried)})")

    def _failed(self, engine: Engine, e: httpx.TransportError) -> EngineError:
        """A request that reached the engine and then failed: the engine stays (health checks decide)."""
        if isinstance(e, httpx.TimeoutException):
            return EngineError(504, f"engine {engine.url} did not answer within {self.timeout:g} s")
        return EngineError(502, f"engine {engine.url} failed: {type(e).__name__}")

    def _eject(self, engine: Engine, why: str) -> None:
        log.warning("engine %s failed (%s); ejected until healthy", engine.url, why)
        engine.healthy = False

    async def check_health(self) -> None:
        await asyncio.gather(*(self._check(e) for e in list(self.engines.values())))

    async def _check(self, engine: Engine) -> None:
        try:
            ok = (await self.client.get(engine.url + "/health", timeout=5.0)).status_code == 200
            if ok and not engine.version_checked:
                await self._check_version(engine)
        except httpx.HTTPError:
            ok = False
        ok = ok and engine.refused is None
        if ok != engine.healthy:
            log.warning("engine %s is now %s", engine.url, "healthy" if ok else "unhealthy")
        engine.healthy = ok

    async def _check_version(self, engine: Engine) -> None:
        """Turns record integer weight versions: refuse an engine reporting another kind (SGLang's
        default is "default"). An engine without /model_info (a router in front) is trusted."""
        response = await self.client.get(engine.url + "/model_info", timeout=5.0)
        engine.version_checked = True
        try:
            info = response.json() if response.status_code == 200 else None
        except ValueError:
            return
        version = info.get("weight_version") if isinstance(info, dict) else None
        if version is None:
            return
        try:
            int(version)
        except (TypeError, ValueError):
            engine.refused = (
                f"engine {engine.url} reports weight_version {version!r}, which is not an integer; "
                "start SGLang with --weight-version 0"
            )
            log.error("%s; it is kept out of the pool", engine.refused)
            return
        engine.weight_version = str(version)

    async def health_loop(self, interval: float) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.check_health()
            await asyncio.sleep(interval)

    async def broadcast(self, path: str, body: dict | None) -> list[dict]:
        """POST `body` to `path` on every engine; one result per engine, failures included."""
        return list(await asyncio.gather(*(self._post(e, path, body) for e in list(self.engines.values()))))

    async def _post(self, engine: Engine, path: str, body: dict | None) -> dict:
        try:
            response = await self.client.post(engine.url + path, json=body or {}, timeout=self.timeout)
        except httpx.HTTPError as e:
            return {"url": engine.url, "ok": False, "error": repr(e)}
        result: dict = {"url": engine.url, "ok": response.status_code == 200, "status_code": response.status_code}
        with contextlib.suppress(ValueError):
            result["response"] = response.json()
        if isinstance(result.get("response"), dict) and result["response"].get("success") is False:
            result["ok"] = False  # SGLang answers 200 with success=false for some failed updates
        return result

    async def weight_versions(self) -> dict[str, str | None]:
        async def one(engine: Engine) -> str | None:
            try:  # the same reading and integer check as on admission
                await self._check_version(engine)
            except httpx.HTTPError:
                return None
            return engine.weight_version

        engines = list(self.engines.values())
        return dict(zip((e.url for e in engines), await asyncio.gather(*map(one, engines)), strict=True))
