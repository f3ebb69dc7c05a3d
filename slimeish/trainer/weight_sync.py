"""Push the trainer's weights to the inference engines: pause -> flush -> update -> continue.

Talks either to the router's admin fan-out (`/admin/...`, bearer admin token; the router forwards
each call to every engine) or straight to a list of engines (SGLang endpoint names), so the same
client works before, behind and without a router. With router replicas one router fans out and
the others are told the update (`/admin/record_update`): each engine is updated once. Generation
is paused in place: no request is aborted, running requests continue with the new weights and
report both versions.

Update methods:
- `tensor`: the same-host fast path. The trainer writes one safetensors file with HF names to
  shared memory (/dev/shm) and sends its path (`load_format: "safetensors_path"`); no weights
  travel through JSON.
- `disk`: the trainer exports a HF checkpoint directory and engines load it (`model_path`); works
  across hosts given a shared filesystem.
- `distributed`: GPU engines only (SGLang); tensors are broadcast over an NCCL group from trainer
  rank 0 (`nccl_broadcast.py`). Needs `engine_urls`.

A LoRA run (`--lora-rank`) moves only its adapter, whatever the method but `distributed`: a PEFT
directory (in shared memory, or under `disk_dir` with `disk`) that each engine loads by path with
`/load_lora_adapter` under `lora_name`, replacing the previous version in place.

With several trainer ranks every rank calls `sync` (gathering tensor-parallel shards is a
collective); only global rank 0 talks to the engines.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx
import tenacity
import torch
from safetensors.torch import save_file

from slimeish.common.config import help_field
from slimeish.common.plugins import load_function
from slimeish.common.procs import free_port
from slimeish.trainer.config import LORA_ADAPTER_NAME, LoraSpec
from slimeish.trainer.distributed import global_rank

log = logging.getLogger(__name__)


POST_WRITE_SIGNATURE = "def hook(args, version_dir: str, rollout_engines) -> None"


@dataclass(kw_only=True)
class WeightSyncConfig:
    router_url: str | None = help_field(None, help="router base URL: sync through its /admin fan-out")
    admin_token: str | None = help_field(None, help="router admin token (Authorization: Bearer)")
    record_router_urls: list[str] = help_field(
        [],
        help="the run's other routers (replicas): router_url updates every engine once, these only record the "
        "update (to catch up an engine that comes back behind it)",
    )
    engine_urls: list[str] = help_field([], help="engine base URLs to update directly (when no router)")
    method: Literal["tensor", "disk", "distributed"] = help_field(
        "tensor",
        help="tensor: safetensors in shared memory; disk: HF checkpoint dir; distributed: NCCL broadcast (GPU)",
    )
    shm_dir: Path = help_field(Path("/dev/shm"), help="where the tensor method writes its safetensors file")
    disk_dir: Path | None = help_field(None, help="where the disk method exports checkpoints (default: a temp dir)")
    timeout_s: float = help_field(600.0, help="HTTP timeout of each call")
    retry_s: float = help_field(120.0, help="how long to retry a router that cannot be reached (restarting)")
    nccl_master_address: str = help_field(
        "127.0.0.1", help="distributed: address of trainer rank 0, reachable by engines"
    )
    nccl_master_port: int | None = help_field(None, help="distributed: port of the NCCL rendezvous (default: free)")
    lora_name: str = help_field(
        LORA_ADAPTER_NAME,
        help="LoRA runs: the name the trainer's adapter is loaded under on the engines (/load_lora_adapter), "
        "which requests give as lora_path",
    )
    post_write_path: str | None = help_field(
        None,
        help=f"disk: slime's hook run once a version's files are written, before the engines load them: "
        f"{POST_WRITE_SIGNATURE} (args: these options; rollout_engines: the engine URLs, empty behind a router)",
    )

    def __post_init__(self) -> None:
        if bool(self.router_url) == bool(self.engine_urls):
            raise ValueError("give exactly one of router_url and engine_urls")
        if self.router_url and not self.admin_token:
            raise ValueError("router_url needs admin_token")
        if self.record_router_urls and not self.router_url:
            raise ValueError("record_router_urls needs router_url: the router that updates the engines")
        if self.method == "distributed" and not self.engine_urls:
            raise ValueError("method='distributed' talks to each engine: give engine_urls")


class SyncSource(Protocol):
    """What the sync needs from a trainer (`Trainer` is one)."""

    @property
    def weight_version(self) -> int: ...  # read only: the trainer alone advances it

    @property
    def lora(self) -> LoraSpec | None: ...  # a LoRA run: only its adapter is pushed

    def hf_state_dict(self) -> dict[str, torch.Tensor]: ...
    def export_hf(self, out_dir: str | Path) -> Path: ...
    def export_peft(self, out_dir: str | Path) -> Path: ...


class WeightSyncError(RuntimeError):
    pass


class WeightSync:
    def __init__(self, config: WeightSyncConfig):
        self.config = config
        headers = {"Authorization": f"Bearer {config.admin_token}"} if config.router_url else {}
        self._client = httpx.Client(timeout=config.timeout_s, headers=headers)
        self._disk_root: Path | None = None
        if config.method == "disk":
            self._disk_root = Path(config.disk_dir or tempfile.mkdtemp(prefix="slimeish-weights-"))
        self._post_write = None
        if config.post_write_path:
            self._post_write = load_function(
                config.post_write_path, expected=POST_WRITE_SIGNATURE, params=["args", "version_dir", "rollout_engines"]
            )
        self._nccl = None
        if config.method == "distributed":
            from slimeish.trainer.nccl_broadcast import NcclWeightBroadcast

            port = config.nccl_master_port or free_port()
            self._nccl = NcclWeightBroadcast(config.engine_urls, self._client, config.nccl_master_address, port)

    def close(self) -> None:
        if self.config.method == "tensor":
            self._remove_shm_files()
            shutil.rmtree(self._adapter_dir("0").parent, ignore_errors=True)
        if self._nccl is not None:
            self._nccl.close()
        self._client.close()

    def __enter__(self) -> WeightSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sync(self, trainer: SyncSource) -> dict[str, float]:
        """Update every engine to the trainer's current weights; returns seconds per phase."""
        if global_rank() != 0:  # take part in the tensor-parallel gather; rank 0 does the rest
            if trainer.lora is not None:
                trainer.export_peft(self._adapter_dir("0"))  # writes nothing off rank 0
            else:
                trainer.hf_state_dict()
            return {}
        version = str(trainer.weight_version)
        timings: dict[str, float] = {}
        start = time.perf_counter()
        payload, served = self._timed(timings, "serialize", lambda: self._prepare(trainer, version))
        self._timed(timings, "pause", lambda: self._call("pause_generation", {"mode": "in_place"}))
        try:
            self._timed(timings, "flush", lambda: self._call("flush_cache", {}))
            self._timed(timings, "update", lambda: self._update(payload, version))
        finally:
            self._timed(timings, "continue", lambda: self._call("continue_generation", {}))
        served()  # only now may the previous version's weights go
        timings["total"] = time.perf_counter() - start
        return timings

    def serves(self, version: int, *, adapter: str | None = None) -> bool:
        """Whether every engine already reports weight `version` of the base weights, or of LoRA
        `adapter` (the router's view of its engines, or each engine's /model_info); an engine that
        reports none is not trusted to."""
        if self.config.router_url:
            r = self._client.get(f"{self.config.router_url.rstrip('/')}/admin/engines")
            r.raise_for_status()
            engines, base, adapters = r.json()["engines"], "weight_version", "adapter_versions"
        else:
            engines = [self._client.get(f"{u.rstrip('/')}/model_info").json() for u in self.config.engine_urls]
            base, adapters = "weight_version", "lora_weight_versions"
        reported = [e.get(base) if adapter is None else (e.get(adapters) or {}).get(adapter) for e in engines]
        return bool(reported) and all(v is not None and str(v) == str(version) for v in reported)

    @staticmethod
    def _timed(timings: dict[str, float], phase: str, fn):
        t = time.perf_counter()
        result = fn()
        timings[phase] = time.perf_counter() - t
        return result

    def _update(self, payload: dict[str, Any], version: str) -> None:
        if self._nccl is not None:
            self._nccl.update(payload["state"], version)
            return
        endpoint = "load_lora_adapter" if "lora_path" in payload else f"update_weights_from_{self.config.method}"
        replies = self._call(endpoint, payload)
        _check_versions(replies, version)
        self._record(endpoint, payload)  # before generation continues: all routers agree

    def unload_adapter(self) -> None:
        """A LoRA run's end: its adapter leaves the engines it shares with other runs (SGLang's
        /unload_lora_adapter: the requests still using it finish with it), and every router of the
        run forgets it, so none loads it into an engine that comes back."""
        if global_rank() != 0:
            return
        body = {"lora_name": self.config.lora_name}
        self._call("unload_lora_adapter", body)
        self._record("unload_lora_adapter", body)

    def _record(self, endpoint: str, body: dict[str, Any]) -> None:
        """Tell the run's other routers what the first one fanned out (`/admin/record_update`)."""
        for router in self.config.record_router_urls:
            url = f"{router.rstrip('/')}/admin/record_update"
            try:
                r = self._post(url, {"path": f"/{endpoint}", "body": body})
            except httpx.TransportError as e:
                raise WeightSyncError(f"{url}: no answer for {self.config.retry_s:g} s: {e!r}") from e
            if r.status_code != 200:
                raise WeightSyncError(f"{url}: HTTP {r.status_code}: {r.text[:500]}")

    def _prepare(self, trainer: SyncSource, version: str) -> tuple[dict[str, Any], Any]:
        if trainer.lora is not None:
            return self._prepare_adapter(trainer, version)
        if self.config.method == "distributed":
            return {"state": trainer.hf_state_dict()}, lambda: None
        if self._disk_root is not None:
            out = trainer.export_hf(self._disk_root / f"v{version}")
            if self._post_write is not None:  # slime: e.g. publish the files on a non-POSIX filesystem
                self._post_write(argparse.Namespace(**asdict(self.config)), str(out), list(self.config.engine_urls))
            return {"model_path": str(out), "weight_version": version}, lambda: _remove_older(out)
        path = self.config.shm_dir / f"slimeish-{os.getpid()}-v{version}.safetensors"
        save_file(trainer.hf_state_dict(), path)
        body = {
            "serialized_named_tensors": [str(path)],
            "load_format": "safetensors_path",
            "weight_version": version,
            "flush_cache": True,
        }
        return body, lambda: self._remove_shm_files(but=path)

    def _adapter_dir(self, version: str) -> Path:
        root = self._disk_root or self.config.shm_dir / f"slimeish-lora-{os.getpid()}"
        return root / f"lora-v{version}"

    def _prepare_adapter(self, trainer: SyncSource, version: str) -> tuple[dict[str, Any], Any]:
        """A LoRA run moves only its adapter: a PEFT directory the engines load by path (SGLang's
        /load_lora_adapter). The directory of the served version stays for the router's catch-up."""
        if self.config.method == "distributed":
            raise WeightSyncError("a LoRA run syncs its adapter by path: use method 'tensor' or 'disk'")
        out = trainer.export_peft(self._adapter_dir(version))
        body = {"lora_name": self.config.lora_name, "lora_path": str(out), "weight_version": version}
        return body, lambda: _remove_older(out)

    def _remove_shm_files(self, but: Path | None = None) -> None:
        """This process's tensor files except `but`: the file of the version the engines serve
        stays until the next sync (or `close`), as the router replays it to an engine that
        comes back behind it."""
        for f in self.config.shm_dir.glob(f"slimeish-{os.getpid()}-v*.safetensors"):
            if f != but:
                f.unlink(missing_ok=True)

    def _post(self, url: str, body: dict[str, Any]) -> httpx.Response:
        """POST, retried while the other side cannot be reached: a router being restarted by its
        supervisor answers again within seconds. Every sync call is idempotent."""
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_transport_error),
            wait=tenacity.wait_exponential(multiplier=0.2, max=5),
            stop=tenacity.stop_after_delay(self.config.retry_s if self.config.router_url else 0),
            reraise=True,
        )
        return retrying(self._client.post, url, json=body)

    def _call(self, endpoint: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """POST to the router's admin endpoint or to every engine; raise on any failure."""
        if self.config.router_url:
            urls = [f"{self.config.router_url.rstrip('/')}/admin/{endpoint}"]
        else:
            urls = [f"{u.rstrip('/')}/{endpoint}" for u in self.config.engine_urls]
        replies = []
        for url in urls:
            try:
                r = self._post(url, body)
            except httpx.TransportError as e:
                if self.config.router_url:
                    raise WeightSyncError(f"{url}: no answer for {self.config.retry_s:g} s: {e!r}") from e
                log.warning("weight sync skips engine %s, which cannot be reached (%r)", url, e)
                continue
            if r.status_code != 200:
                raise WeightSyncError(f"{url}: HTTP {r.status_code}: {r.text[:500]}")
            data = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            if isinstance(data, dict) and (data.get("success") is False or data.get("ok") is False):
                raise WeightSyncError(f"{url}: {data.get('message', data)}")
            replies.append(data)
        return replies


def _transport_error(e: BaseException) -> bool:
    return isinstance(e, httpx.TransportError)


def _remove_older(current: Path) -> None:
    """Keep only the newest exported version: engines have loaded it, older ones are dead weight."""
    for d in current.parent.glob(current.name.rsplit("v", 1)[0] + "v*"):
        if d != current and d.is_dir():
            shutil.rmtree(d, ignore_errors=True)


def _check_versions(replies: list[dict[str, Any]], version: str) -> None:
    """Each engine (directly, or listed in the router's reply) must report the new version; the
    router's fan-out skips engines that are down (it brings them up to date when they return)."""
    engines: list[dict[str, Any]] = []
    for reply in replies:
        engines.extend(reply.get("engines", [reply]) if isinstance(reply, dict) else [])
    for e in engines:
        if e.get("skipped"):
            continue
        if e.get("ok") is False or e.get("success") is False:
            raise WeightSyncError(f"engine {e.get('url', '?')} failed to update: {e}")
        if "weight_version" in e and str(e["weight_version"]) != version:
            raise WeightSyncError(
                f"engine {e.get('url', '?')} reports version {e['weight_version']}, expected {version}"
            )
