"""`slimeish engine`: serve a Hugging Face causal LM over SGLang's native HTTP API.

A small, exact CPU/GPU inference server with continuous batching, so slimeish runs end to end
without SGLang (which needs CUDA). The router talks to it exactly as it talks to SGLang.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import torch
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from slimeish.common.config import add_dataclass_args, from_namespace
from slimeish.engine.config import EngineConfig
from slimeish.engine.model_runner import DECODE_VIEW_BYTES, ModelRunner
from slimeish.engine.protocol import (
    ENGINE_NAME,
    Limits,
    RequestError,
    SequenceRequest,
    parse_generate,
    parse_sampling_params,
)
from slimeish.engine.responses import render
from slimeish.engine.scheduler import Scheduler, SchedulerConfig, Sequence

logger = logging.getLogger(__name__)


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def _error(message: str, status: int = 400) -> Response:
    return _json({"error": {"message": message, "code": status}}, status)


async def _body(request: Request) -> Any:
    # orjson refuses what json would crash on or pass along: bytes that are not UTF-8, lone
    # surrogates (the tokenizer cannot encode them) and nesting deep enough to exhaust the stack.
    try:
        return orjson.loads(await request.body() or b"{}")
    except orjson.JSONDecodeError as e:
        raise RequestError(f"request body is not valid JSON: {e}") from None


class Engine:
    """The runner, the scheduler and the facts the admin endpoints report."""

    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        if cfg.device == "cpu":
            torch.set_num_threads(cfg.cpu_threads)
        self.runner = ModelRunner(cfg.model, device=cfg.device, dtype=cfg.dtype, context_length=cfg.context_length)
        total = kv_pool_tokens(cfg, self.runner.kv_bytes_per_token)
        if total < self.runner.context_length:  # a sequence that could never fit the pool would wait forever
            logger.warning("KV pool holds %d tokens: context length lowered from %d", total, self.runner.context_length)
            self.runner.context_length = total
        sched_cfg = SchedulerConfig(
            max_rows=cfg.max_running_requests, max_prefill_tokens=cfg.max_prefill_tokens,
            chunk_size=cfg.chunked_prefill_size, total_tokens=total, page_size=cfg.page_size,
            prefix_cache=not cfg.disable_radix_cache,
        )  # fmt: skip
        self.scheduler = Scheduler(self.runner, sched_cfg, weight_version=cfg.weight_version)
        moe = self.runner.routes is not None
        self.limits = Limits(
            self.runner.vocab_size, self.runner.context_length, cfg.max_request_sequences, moe=moe,
            adapters=self.runner.lora.adapters.keys(),
        )  # fmt: skip
        self.model_name = cfg.served_model_name or cfg.model

    def tokenize(self, text: str) -> list[int]:
        return self.runner.tokenizer.encode(text)  # as SGLang does: special tokens (e.g. BOS) per tokenizer

    def set_weight_version(self, version: int | None) -> int:
        """A weight update sets the version it was given, or bumps the version by one."""
        self.scheduler.weight_version = self.scheduler.weight_version + 1 if version is None else version
        return self.scheduler.weight_version


def kv_pool_tokens(cfg: EngineConfig, bytes_per_token: int) -> int:
    """The KV pool's size in tokens: `--max-total-tokens`, or `--mem-fraction-static` of the device's
    memory (on CPU the physical RAM; the pool is only backed as pages get written) less the decode
    view's cap, which holds copies of the decoding rows' KV, in whole pages."""
    if cfg.max_total_tokens is not None:
        tokens = cfg.max_total_tokens
    else:
        if cfg.device == "cuda":
            memory = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        else:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        tokens = (int(memory * cfg.mem_fraction_static) - DECODE_VIEW_BYTES) // bytes_per_token
    tokens -= tokens % cfg.page_size
    if tokens < cfg.page_size:
        raise ValueError(
            f"the KV pool must hold at least one page ({cfg.page_size} tokens), got {max(tokens, 0)} tokens: "
            "raise --max-total-tokens, or --mem-fraction-static (its share holds the pool and "
            f"{DECODE_VIEW_BYTES >> 20} MiB of decode view)"
        )
    return tokens


def create_app(cfg: EngineConfig) -> FastAPI:
    engine = Engine(cfg)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop_task = asyncio.create_task(engine.scheduler.run())
        yield
        loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop_task

    app = FastAPI(title="slimeish engine", lifespan=lifespan)
    app.state.engine = engine

    @app.exception_handler(RequestError)
    async def _bad_request(request: Request, exc: RequestError) -> Response:
        return _error(str(exc))

    _add_generate_routes(app, engine)
    _add_info_routes(app, engine)
    _add_control_routes(app, engine)
    _add_lora_routes(app, engine)
    return app


def _add_generate_routes(app: FastAPI, engine: Engine) -> None:
    @app.post("/generate")
    async def generate(request: Request) -> Response:
        body = await _body(request)
        parse = functools.partial(parse_generate, body, engine.tokenize, engine.limits)
        # Tokenizing a large `text` goes off the event loop, so it cannot hold up /health or other
        # requests; token ids (the router's requests) are parsed here: a thread hop cost more than
        # the parse (~5 % of the engine's CPU at 64 concurrent requests, with the GIL contended).
        tokenizes = isinstance(body, dict) and body.get("text") is not None
        seqs, is_batch, stream = await asyncio.to_thread(parse) if tokenizes else parse()
        if stream:
            return StreamingResponse(_stream(engine.scheduler, seqs, is_batch), media_type="text/event-stream")
        done = await _until_disconnect(request, _run_to_end(engine.scheduler, seqs))
        out = [render(s, engine.scheduler, index=s.req.index if is_batch else None) for s in done]
        return _json(out if is_batch else out[0])

    @app.get("/health_generate")
    async def health_generate() -> Response:
        if not engine.scheduler.paused:  # a paused engine holds requests on purpose; it is still alive
            params = parse_sampling_params({"max_new_tokens": 1, "temperature": 0})
            req = SequenceRequest("health", 0, [0], params, None, False, False, 1)
            await asyncio.wait_for(_run_to_end(engine.scheduler, [req]), timeout=60)
        return Response(status_code=200)


async def _run_to_end(sched: Scheduler, reqs: list[SequenceRequest]) -> list[Sequence]:
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in reqs]

    def notifier(fut: asyncio.Future) -> Callable[[Sequence], None]:
        def notify(seq: Sequence) -> None:
            if seq.finished and not fut.done():
                fut.set_result(seq)

        return notify

    seqs = [sched.submit(r, notifier(f)) for r, f in zip(reqs, futures, strict=True)]
    try:
        return list(await asyncio.gather(*futures))
    except asyncio.CancelledError:  # the client went away: free the slots
        sched.abort_sequences([s for s in seqs if not s.finished], "client disconnected")
        raise


async def _until_disconnect(request: Request, work):
    """Await `work`, cancelling it (which aborts its sequences) if the client hangs up first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait([task, watcher], return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
    return await task


async def _disconnected(request: Request) -> None:
    # The body is already read, so the next ASGI message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _stream(sched: Scheduler, reqs: list[SequenceRequest], is_batch: bool) -> AsyncIterator[bytes]:
    """SSE in SGLang's format: `data: {chunk}` per new token, then `data: [DONE]`."""
    queue: asyncio.Queue[Sequence] = asyncio.Queue()
    seqs = [sched.submit(r, queue.put_nowait) for r in reqs]
    sent, done = [0] * len(seqs), set[int]()
    try:
        while len(done) < len(seqs):
            seq = await queue.get()
            i = seq.req.index
            if i in done or (len(seq.output_ids) == sent[i] and not seq.finished):
                continue
            text = seq.text if seq.finished else sched.decode(seq)
            chunk = render(seq, sched, index=i if is_batch else None, text=text)
            sent[i] = len(seq.output_ids)
            if seq.finished:
                done.add(i)
            yield b"data: " + orjson.dumps(chunk) + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        sched.abort_sequences([s for s in seqs if not s.finished], "client disconnected")


def _add_info_routes(app: FastAPI, engine: Engine) -> None:
    cfg = engine.cfg

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> Response:
        return _json(
            {
                "model_path": cfg.model,
                "served_model_name": engine.model_name,
                "tokenizer_path": cfg.model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": str(engine.scheduler.weight_version),  # SGLang's schema: a string
                # not SGLang's: each loaded LoRA adapter's own version (a LoRA run's sync versions its adapter)
                "lora_weight_versions": {name: str(v) for name, v in engine.runner.lora.versions.items()},
                "load_format": "auto",
                "engine": ENGINE_NAME,  # not SGLang's: lets `slimeish train` tell its own engines apart
            }
        )

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> Response:
        sched = engine.scheduler
        return _json(
            {
                "model_path": cfg.model,
                "served_model_name": engine.model_name,
                "tokenizer_path": cfg.model,
                "max_context_length": engine.runner.context_length,
                "version": "slimeish-engine",
                "host": cfg.host,
                "port": cfg.port,
                "device": cfg.device,
                "max_running_requests": cfg.max_running_requests,
                "max_prefill_tokens": cfg.max_prefill_tokens,
                "chunked_prefill_size": cfg.chunked_prefill_size,
                "max_total_num_tokens": sched.pool.num_pages * sched.pool.page_size,
                "page_size": sched.pool.page_size,
                "disable_radix_cache": cfg.disable_radix_cache,
                "weight_version": str(sched.weight_version),
                "internal_states": [
                    {
                        "paused": sched.paused,
                        "num_running": len(sched.running),
                        "num_waiting": len(sched.waiting),
                        "cached_tokens": sched.pool.cached_pages * sched.pool.page_size,
                        "available_tokens": (sched.pool.available - sched.reserved) * sched.pool.page_size,
                    }
                ],
            }
        )

    @app.get("/v1/models")
    async def models() -> Response:
        card = {"id": engine.model_name, "object": "model", "created": int(time.time()), "owned_by": "slimeish"}
        card |= {"root": cfg.model, "max_model_len": engine.runner.context_length}
        return _json({"object": "list", "data": [card]})


def _add_control_routes(app: FastAPI, engine: Engine) -> None:
    sched = engine.scheduler

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        sched.flush_cache()
        return Response("Cache flushed.", status_code=200)

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await _body(request)
        if not isinstance(body, dict) or not (body.get("abort_all") or isinstance(body.get("rid"), str)):
            raise RequestError('give {"rid": "<request id>"} or {"abort_all": true}')
        n = sched.abort(None if body.get("abort_all") else body["rid"])
        return _json({"success": True, "num_aborted": n})

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> Response:
        body = await _body(request)
        mode = body.get("mode", "in_place") if isinstance(body, dict) else None
        if mode not in ("in_place", "abort"):
            raise RequestError(f"mode must be 'in_place' or 'abort', got {mode!r}")
        if mode == "abort":
            sched.abort(None, "aborted by /pause_generation")
        sched.pause()
        return _json({"success": True, "message": f"generation paused ({mode})"})

    @app.post("/continue_generation")
    async def continue_generation() -> Response:
        sched.resume()
        return _json({"success": True, "message": "generation continued"})

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> Response:
        body = await _body(request)
        path = body.get("model_path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not Path(path).is_dir():
            raise RequestError(f"model_path must be an existing checkpoint directory, got {path!r}")
        return _update(engine, lambda: engine.runner.load_checkpoint_dir(path), body)

    @app.post("/update_weights_from_tensor")
    async def update_weights_from_tensor(request: Request) -> Response:
        body = await _body(request)
        paths = _safetensors_paths(body)
        return _update(engine, lambda: sum(engine.runner.load_state_dict_file(p) for p in paths), body)


def _add_lora_routes(app: FastAPI, engine: Engine) -> None:
    """SGLang's adapter endpoints and reply shape (`success`, `error_message`, `loaded_adapters`).
    Loading a name that is loaded already swaps its weights in place (the trainer's LoRA sync):
    sequences generating with it continue with the new weights, none is aborted. Loads and unloads
    take effect in the order they arrived: a load reads its files off the event loop, and one that
    read faster must not be overwritten by an earlier version that read slower."""
    lora = engine.runner.lora
    in_order = asyncio.Lock()  # FIFO: each change waits for the ones that arrived before it

    def reply(success: bool, error: str | None = None, **extra: Any) -> Response:
        loaded = {name: a.path for name, a in lora.adapters.items()}
        body = {"success": success, "error_message": error, "loaded_adapters": loaded} | extra
        return _json(body, 200 if success else 400)

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        body = await _body(request)
        name, path = (body.get("lora_name"), body.get("lora_path")) if isinstance(body, dict) else (None, None)
        if not isinstance(name, str) or not name or not isinstance(path, str):
            raise RequestError('give {"lora_name": "<name>", "lora_path": "<PEFT adapter directory>"}')
        version = _request_version(body.get("weight_version"))  # checked before anything changes
        async with in_order:
            try:
                adapter = await asyncio.to_thread(lora.read, name, path)  # reading files stays off the event loop
            except (ValueError, OSError, KeyError) as e:
                return reply(False, f"loading LoRA adapter {name!r} failed: {e}")
            return reply(True, weight_version=str(lora.install(adapter, version)))

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        body = await _body(request)
        name = body.get("lora_name") if isinstance(body, dict) else None
        if not isinstance(name, str):
            raise RequestError('give {"lora_name": "<name>"}')
        async with in_order:  # after the loads that arrived before it
            try:
                lora.retire(name)
            except ValueError as e:
                return reply(False, str(e))
            # As SGLang does: new requests for it are refused now, the ones using it finish with it.
            while engine.scheduler.uses_adapter(name):
                await asyncio.sleep(_UNLOAD_POLL_S)
            lora.drop(name)
            return reply(True)


def _safetensors_paths(body: Any) -> list[str]:
    """The same-host fast path: the trainer writes safetensors files (HF names) and sends their paths."""
    if not isinstance(body, dict) or body.get("load_format") != "safetensors_path":
        raise RequestError(
            'the embedded engine accepts only load_format "safetensors_path": '
            "serialized_named_tensors is a list of paths to safetensors files with Hugging Face parameter names"
        )
    paths = body.get("serialized_named_tensors")
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and Path(p).is_file() for p in paths):
        raise RequestError(f"serialized_named_tensors must list existing safetensors files, got {paths!r}")
    return paths


def _update(engine: Engine, load: Callable[[], int], body: dict) -> Response:
    requested = _request_version(body.get("weight_version"))  # checked before any weight changes
    try:
        count = load()
    except (ValueError, OSError) as e:
        return _json({"success": False, "message": f"weight update failed: {e}"}, 400)
    finally:  # even a failed multi-shard update may have copied some shards: cached KV is stale
        engine.scheduler.flush_cache()
    version = engine.set_weight_version(requested)
    return _json({"success": True, "message": f"updated {count} tensors", "weight_version": str(version)})


def _request_version(value: object) -> int | None:
    """A request's `weight_version` (a string in SGLang's schema) as the integer slimeish counts."""
    if value is None:
        return None
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        with contextlib.suppress(ValueError):
            return int(value)
    raise RequestError(f"weight_version must be an integer (or a string holding one), got {value!r}")


KEEP_ALIVE_S = 75
_UNLOAD_POLL_S = 0.05  # an unload checks this often whether the requests using its adapter are done


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="slimeish engine", description=__doc__.split("\n\n")[0])
    add_dataclass_args(parser, EngineConfig, "engine")
    cfg = from_namespace(EngineConfig, parser.parse_args(argv))
    # A paused engine holds requests indefinitely; on SIGTERM give them a few seconds, then close.
    # Idle connections stay open longer than clients keep them (httpx: 5 s by default, the router:
    # 30 s): a server closing one as a client reuses it fails that request with a ReadError.
    uvicorn.run(
        create_app(cfg),
        host=cfg.host,
        port=cfg.port,
        log_level=cfg.log_level,
        timeout_graceful_shutdown=3,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
