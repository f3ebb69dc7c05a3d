"""Engines behind the router: sticky placement, least-loaded choice, health checks, retries.

An engine is any server speaking SGLang's native HTTP protocol (an SGLang server, the embedded
engine, or an SGLang/smg router in front of several). A session sticks to one engine so its
prefix stays in that engine's cache; a request whose engine cannot be reached is retried
on another healthy engine (at most `retries` times), and the failed one is ejected until a health
check re-admits it; an engine that dropped a connection is first tried once more. An engine
that answers with an error or times out fails only that request: a poison request or a long
generation must not empty the pool.

Weight updates go to the engines that are up (`fan_out`); one that is down is skipped, and the
pool remembers the last update, so an engine that comes back serving an older version (restarted,
or down during an update) is brought to the pool's version before it is re-admitted. With several
routers, one fans the update out and the others only `record` it. Each LoRA adapter has a version of
its own (several runs share the engines, each syncing its adapter): the pool keeps the last update of
the base weights and of each adapter, and replays each one an engine is behind on.

The HTTP hop to one engine is `engine_http`'s, and what the pool knows of each engine and of the
updates is `engines`'. `timeout` bounds connecting and each read, not a whole stream, so
a long generation is never cut while tokens flow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any

import aiohttp
import orjson

from slimeish.router.engine_api import Answer, GenerateReply
from slimeish.router.engine_http import (
    CONNECT_TIMEOUT,
    GENERATE_ERRORS,
    HTTP_ERRORS,
    IDLE_CONNECTION_S,
    JSON,
    EngineError,
    EngineFailedMidStream,
    Item,
    Reader,
    dropped,
    generate_client,
    read_chunks,
    read_whole,
    unreachable,
)
from slimeish.router.engines import (
    UPDATE_PATHS,
    Engine,
    WeightUpdate,
    note_answer_version,
    refused_by_all,
    set_health,
    took,
    update_target,
)
from slimeish.router.jsontypes import JSONObject

log = logging.getLogger(__name__)


class NoEngineError(RuntimeError):
    """No healthy engine could serve the request (an HTTP 503 for the client)."""


class EnginePool:
    def __init__(
        self,
        client: aiohttp.ClientSession,
        urls: list[str],
        timeout: float,
        retries: int = 2,
        check_timeout: float = 5.0,
        failure_threshold: int = 3,
        idle_s: float = IDLE_CONNECTION_S,
    ):
        self.client = client  # the engines' other calls
        self.generating = generate_client(idle_s)  # /generate's connections, owned by the pool
        self.timeout = timeout
        self._check_timeout = aiohttp.ClientTimeout(total=check_timeout)
        self.failure_threshold = failure_threshold  # failed checks in a row that eject a reachable engine
        self._connect_timeout = min(timeout, CONNECT_TIMEOUT)
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout, sock_read=timeout)
        self.retries = retries  # other engines tried after one cannot be reached
        self.engines: dict[str, Engine] = {}
        self.updates: dict[str | None, WeightUpdate] = {}  # the last update of the base (None) and of each adapter
        self._updating = asyncio.Lock()  # an update fan-out and a catch-up never interleave
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

    def close(self) -> None:
        """Close the idle /generate connections (the router stops)."""
        self.generating.close()

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

    def pick(self, sticky: str | None, exclude: Collection[str] = frozenset()) -> Engine:
        """The session's engine if it is healthy, else the least-loaded healthy engine."""
        engine = self.engines.get(sticky) if sticky else None
        if engine is not None and engine.healthy and engine.url not in exclude:
            return engine
        candidates = [e for e in self.engines.values() if e.healthy and e.url not in exclude]
        if not candidates:
            raise NoEngineError("no healthy engine is available")
        return min(candidates, key=lambda e: (e.inflight, e.sessions))

    async def generate(self, payload: Mapping[str, Any], sticky: str | None) -> tuple[Answer, Engine]:
        """POST /generate, retried on another engine only when one cannot be reached (see
        `_not_reached`)."""
        # `read_whole` yields one answer; running `_send` to its end releases the engine right there.
        [(answer, engine)] = [a async for a in self._send(orjson.dumps(payload), sticky, read_whole)]
        note_answer_version(engine, answer, payload)
        return answer, engine

    def stream(self, payload: Mapping[str, Any], sticky: str | None) -> AsyncIterator[tuple[GenerateReply, Engine]]:
        """POST /generate with `stream: true`, yielding SGLang chunks; an engine that cannot be
        reached is ejected and the request retried on another one."""
        return self._send(orjson.dumps({**payload, "stream": True}), sticky, read_chunks)

    async def _send(self, body: bytes, sticky: str | None, read: Reader[Item]) -> AsyncIterator[tuple[Item, Engine]]:
        """The retry loop of both: POST `body` to /generate and yield what `read` makes of the
        answer. Until the first item is out, an engine that was not reached is given up for the
        next one; after it, a failure ends the request (the client already has output)."""
        tried: list[str] = []
        redialed: set[str] = set()
        while len(tried) <= self.retries:
            engine = self.pick(sticky, set(tried))
            tried.append(engine.url)
            engine.inflight += 1
            started = False
            try:
                async with self.generating.post(
                    engine.url, "/generate", body, self._connect_timeout, self.timeout
                ) as response:
                    async with contextlib.aclosing(read(engine, response)) as items:
                        async for item in items:
                            started = True
                            yield item, engine
                    return
            except GENERATE_ERRORS as e:
                if started:
                    raise EngineFailedMidStream(f"engine {engine.url} failed mid-stream: {e!r}") from e
                if not unreachable(e):
                    raise self._failed(engine, e) from e
                self._not_reached(engine, e, tried, redialed)
            finally:
                engine.inflight -= 1
        raise NoEngineError(f"no engine could be reached (tried {', '.join(tried)})")

    def _failed(self, engine: Engine, e: BaseException) -> EngineError:
        """A request that reached the engine and then failed: the engine stays (health checks decide)."""
        if isinstance(e, TimeoutError):
            return EngineError(504, f"engine {engine.url} did not answer within {self.timeout:g} s")
        return EngineError(502, f"engine {engine.url} failed: {type(e).__name__}")

    def _not_reached(self, engine: Engine, e: BaseException, tried: list[str], redialed: set[str]) -> None:
        """A request that never reached `engine`. A dropped connection is most likely a kept-alive
        one the engine was closing: the engine is tried once more (not counted as a retry, another
        connection) before it is ejected; one that cannot be connected to is ejected at once."""
        if dropped(e) and engine.url not in redialed:
            redialed.add(engine.url)
            tried.remove(engine.url)
            log.info("engine %s dropped a connection (%r); trying it again", engine.url, e)
            return
        self._eject(engine, repr(e))

    def _eject(self, engine: Engine, why: str) -> None:
        log.warning("engine %s failed (%s); ejected until healthy", engine.url, why)
        set_health(engine, False, why)

    async def check_health(self) -> None:
        await asyncio.gather(*(self._check(e) for e in list(self.engines.values())))

    async def _check(self, engine: Engine) -> None:
        """An engine nothing listens on is down at once. One that takes the connection but answers
        late or not 200 is ejected only after `failure_threshold` such checks in a row: a long
        prefill on a busy CPU can hold the embedded engine's /health past the check's timeout, and
        ejecting it then fails its sessions' next turns with 503 though it is serving them. One
        serving weights older than the pool's that fails to catch up is out at once too."""
        out_now, failure = False, "its weight version is behind and it failed to catch up"
        try:
            async with self.client.get(engine.url + "/health", timeout=self._check_timeout) as response:
                if not (ok := response.status == 200):
                    failure = f"its /health answered {response.status}"
            # A version is read on admission and whenever the engine comes back, or its answers
            # showed an older one (restarted between two checks): it may have missed updates.
            if ok and (not engine.version_checked or not engine.healthy or self._behind(engine)):
                await self._check_version(engine)
                if self._behind(engine):
                    ok = await self._catch_up(engine)
                    out_now = not ok
        except aiohttp.ClientConnectorError as e:
            ok, out_now, failure = False, True, f"cannot be connected to ({e.os_error.strerror or e})"
        except HTTP_ERRORS as e:
            late = isinstance(e, TimeoutError)
            ok, failure = False, "its /health " + ("did not answer in time" if late else f"failed ({e!r})")
        engine.failed_checks = 0 if ok else engine.failed_checks + 1
        tolerated = engine.healthy and not out_now and engine.failed_checks < self.failure_threshold
        healthy = engine.refused is None and (ok or tolerated)
        if healthy != engine.healthy:
            log.warning("engine %s is now %s", engine.url, "healthy" if healthy else "unhealthy")
        elif not ok and healthy:
            log.warning("engine %s failed a health check (%d in a row)", engine.url, engine.failed_checks)
        set_health(engine, healthy, engine.refused or failure)

    def _behind(self, engine: Engine) -> bool:
        return bool(self._missed(engine))

    def _missed(self, engine: Engine) -> list[WeightUpdate]:
        """The last updates (base weights first) of what it serves an older version of, or none
        it reports. An engine ahead of one was updated by another router of the run before this one
        learnt of it (`record`): catching up only ever moves an engine forward."""
        ordered = sorted(self.updates.values(), key=lambda u: u.adapter is not None)
        return [u for u in ordered if (v := engine.version(u.adapter)) is None or v < u.version]

    async def _catch_up(self, engine: Engine) -> bool:
        """Replay each last update an engine is behind on; whether it took them all."""
        async with self._updating:
            missed = self._missed(engine)
            for update in missed:
                what = f"LoRA adapter {update.adapter!r}" if update.adapter else "weight"
                log.warning(
                    "engine %s serves %s version %s, the pool %d: loading it before re-admission",
                    engine.url, what, engine.version(update.adapter), update.version,
                )  # fmt: skip
                result = await self._post(engine, update.path, update.body)
                if not result["ok"]:
                    log.error("engine %s failed to load %s version %d: %s", engine.url, what, update.version, result)
            if missed:
                await self._check_version(engine)
        if not self._behind(engine):
            if missed:
                log.warning("engine %s caught up to the pool's weight versions", engine.url)
            return True
        log.error("engine %s still serves older weights than the pool after the catch-up", engine.url)
        return False

    async def _check_version(self, engine: Engine) -> None:
        """Turns record integer weight versions: refuse an engine reporting another kind (SGLang's
        default is "default"). An engine without /model_info (a router in front) is trusted."""
        async with self.client.get(engine.url + "/model_info", timeout=self._check_timeout) as response:
            status, content = response.status, await response.read()
        engine.version_checked = True
        try:
            info = orjson.loads(content) if status == 200 else None
        except orjson.JSONDecodeError:
            return
        if not isinstance(info, dict):
            return
        adapters = info.get("lora_weight_versions")  # the embedded engine's (SGLang reports none)
        if isinstance(adapters, dict):
            engine.adapter_versions = {n: int(v) for n, v in adapters.items()}
            engine.lists_adapters = True
        version = info.get("weight_version")
        if version is None:
            return
        try:
            engine.weight_version = int(version)  # SGLang's schema has it as a string
        except (TypeError, ValueError):
            engine.refused = (
                f"engine {engine.url} reports weight_version {version!r}, which is not an integer; "
                "start SGLang with --weight-version 0"
            )
            log.error("%s; it is kept out of the pool", engine.refused)

    async def health_loop(self, interval: float) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.check_health()
            await asyncio.sleep(interval)

    async def fan_out(self, path: str, body: JSONObject | None) -> list[JSONObject]:
        """POST `body` to `path` on every healthy engine; one result per engine. An engine that is
        down, or fails the call, is skipped (`"skipped": why`) and ejected: a weight update must not
        wait for a dead engine, and the health check catches it up before it serves again. An engine
        that answers any other call (an adapter unload while requests use it) with a 4xx is alive
        and serving what it served: it is reported, not ejected."""
        is_update = path in UPDATE_PATHS
        unloaded = update_target(path, body or {}) if path == "/unload_lora_adapter" else None
        # an unload changes what a catch-up replays, as an update does: neither interleaves with one
        async with self._updating if is_update or unloaded else contextlib.nullcontext():
            engines = list(self.engines.values())
            up = [e for e in engines if e.healthy]
            results = {e.url: {"url": e.url, "ok": False, "skipped": "unhealthy"} for e in engines if not e.healthy}
            for engine, result in zip(up, await asyncio.gather(*(self._post(e, path, body) for e in up)), strict=True):
                if not result["ok"]:
                    result["skipped"] = f"failed {path}"
                    if is_update or not 400 <= result.get("status_code", 500) < 500:
                        self._eject(engine, f"{path}: {result.get('error') or result.get('status_code')}")
                elif unloaded:
                    engine.adapter_versions.pop(unloaded, None)
                results[engine.url] = result
            ordered = [results[e.url] for e in engines]
            if is_update and not refused_by_all(ordered):
                await self._record_update(path, body or {}, up)
            elif unloaded and took(ordered):
                self.updates.pop(unloaded, None)  # no engine that comes back gets it again
        return ordered

    async def _record_update(self, path: str, body: JSONObject, up: list[Engine]) -> None:
        """Remember the update as the version every engine must serve from now on (engines that
        were down take it when they come back); an engine that reports another one is ejected."""
        version = body.get("weight_version")
        if version is None:
            return
        update = WeightUpdate(path, body, int(version))
        self.updates[update.adapter] = update
        for engine in (e for e in up if e.healthy):
            with contextlib.suppress(*HTTP_ERRORS):
                await self._check_version(engine)
            if (served := engine.version(update.adapter)) != update.version:
                self._eject(engine, f"reports version {served} of {path}'s weights after the update")

    async def record(self, path: str, body: JSONObject) -> None:
        """Learn an update another router of the run fanned out (router replicas: each engine is
        updated once, by one router); it replaces the last one, as the trainer decides the order
        (a resumed run goes back to an older version). The engines' versions are read again, so
        every router reports the same. An adapter's unload that another router fanned out makes
        this one forget the adapter's last load too."""
        if path == "/unload_lora_adapter":
            name = update_target(path, body)
            if name is None:
                raise ValueError('an unload\'s body names its adapter: {"lora_name": "<name>"}')
            await self.forget(name)
            return
        version = body.get("weight_version")
        if version is None:
            raise ValueError("the update's body has no weight_version: there is nothing to catch engines up to")
        async with self._updating:
            update = WeightUpdate(path, body, int(version))
            self.updates[update.adapter] = update
            for engine in (e for e in self.engines.values() if e.healthy):
                with contextlib.suppress(*HTTP_ERRORS):
                    await self._check_version(engine)

    async def serves_adapter(self, adapter: str) -> tuple[bool, list[str]]:
        """Whether a healthy engine serves LoRA `adapter`, and the adapters they serve. The engines
        are asked again when this router has not seen it (another run's sync, through another
        router, may have loaded it); engines that list no adapters (SGLang) cannot be checked and
        are trusted."""
        up = [e for e in self.engines.values() if e.healthy]
        if not any(adapter in e.adapter_versions for e in up):
            # only engines that can say (SGLang lists none), all at once: a slow one must not add
            # its check timeout to every session's opening
            askable = [e for e in up if e.lists_adapters or not e.version_checked]
            await asyncio.gather(*(self._read_versions(e) for e in askable))
        loaded = sorted({name for e in up for name in e.adapter_versions})
        return adapter in loaded or not any(e.lists_adapters for e in up), loaded

    async def _read_versions(self, engine: Engine) -> None:
        with contextlib.suppress(*HTTP_ERRORS):  # unreachable: the health check ejects it
            await self._check_version(engine)

    async def forget(self, adapter: str) -> None:
        """Forget LoRA `adapter`'s last load (it was unloaded from the engines): no engine that
        comes back is given it again. Never while a fan-out or a catch-up runs."""
        async with self._updating:
            self.updates.pop(adapter, None)
            for engine in self.engines.values():
                engine.adapter_versions.pop(adapter, None)

    async def _post(self, engine: Engine, path: str, body: JSONObject | None) -> JSONObject:
        try:
            payload = orjson.dumps(body or {})
            url = engine.url + path
            async with self.client.post(url, data=payload, headers=JSON, timeout=self._timeout) as response:
                status, content = response.status, await response.read()
        except HTTP_ERRORS as e:
            return {"url": engine.url, "ok": False, "error": repr(e)}
        result: JSONObject = {"url": engine.url, "ok": status == 200, "status_code": status}
        with contextlib.suppress(orjson.JSONDecodeError):
            result["response"] = orjson.loads(content)
        if isinstance(result.get("response"), dict) and result["response"].get("success") is False:
            result["ok"] = False  # SGLang answers 200 with success=false for some failed updates
        return result
