"""Distributed weight update for GPU engines: broadcast over an NCCL group (SGLang's protocol).

Trainer rank 0 and every engine's GPU workers form one NCCL group (`/init_weights_update_group`;
trainer = rank 0, engine k's tp ranks follow). Each update announces a bucket of tensor names,
dtypes and shapes (`/update_weights_from_distributed`) and then broadcasts the tensors from rank 0;
the engine receives them straight into GPU memory, so nothing goes through disk or host memory.

The group is built with SGLang's own `init_custom_process_group` (a second process group beside
the trainer's default world), which needs the `gpu` extra (`sglang`) on the trainer side too.
This path needs CUDA on both sides and runs engine by engine URL (not through the router), since
each engine's rank offset in the group depends on its tensor-parallel size.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import torch

GROUP_NAME = "slimeish-weight-sync"


class NcclWeightBroadcast:
    def __init__(self, engine_urls: list[str], client: httpx.Client, master_address: str, master_port: int,
                 bucket_bytes: int = 512 << 20):  # fmt: skip
        self.engine_urls = engine_urls
        self.client = client
        self.master_address, self.master_port = master_address, master_port
        self.bucket_bytes = bucket_bytes
        self.group = None
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(engine_urls)))

    def _tp_size(self, url: str) -> int:
        info = self.client.get(f"{url}/server_info").raise_for_status().json()
        return int(info.get("tp_size", 1))

    def connect(self) -> None:
        """Create the group: the engines join (their calls block until rank 0 arrives), then we join."""
        from sglang.srt.utils import init_custom_process_group

        sizes = [self._tp_size(u) for u in self.engine_urls]
        world = 1 + sum(sizes)
        offsets = [1 + sum(sizes[:k]) for k in range(len(sizes))]
        joins = [
            self._pool.submit(self._post, url, "init_weights_update_group", {
                "master_address": self.master_address, "master_port": self.master_port, "rank_offset": offset,
                "world_size": world, "group_name": GROUP_NAME, "backend": "nccl"})
            for url, offset in zip(self.engine_urls, offsets, strict=True)
        ]  # fmt: skip
        self.group = init_custom_process_group(
            backend="nccl", init_method=f"tcp://{self.master_address}:{self.master_port}",
            world_size=world, rank=0, group_name=GROUP_NAME,
        )  # fmt: skip
        for j in joins:
            j.result()

    def update(self, state: dict[str, torch.Tensor], version: str) -> None:
        """Announce each bucket to every engine, broadcast its tensors, wait for the engines' replies."""
        if self.group is None:
            self.connect()
        for bucket in self._buckets(state):
            body = {
                "names": [n for n, _ in bucket],
                "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket],
                "group_name": GROUP_NAME,
                "weight_version": version,
                "flush_cache": True,
            }
            replies = [
                self._pool.submit(self._post, u, "update_weights_from_distributed", body) for u in self.engine_urls
            ]
            for _, tensor in bucket:
                torch.distributed.broadcast(tensor.cuda(non_blocking=True), src=0, group=self.group)
            for r in replies:
                r.result()

    def _buckets(self, state: dict[str, torch.Tensor]) -> Iterator[list[tuple[str, torch.Tensor]]]:
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in state.items():
            if bucket and size + tensor.nbytes > self.bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += tensor.nbytes
        if bucket:
            yield bucket

    def _post(self, url: str, endpoint: str, body: dict) -> dict:
        reply = self.client.post(f"{url}/{endpoint}", json=body)
        data = reply.json() if reply.status_code == 200 else {"success": False, "message": reply.text[:500]}
        if not data.get("success", True):
            raise RuntimeError(f"{url}/{endpoint}: {data.get('message', data)}")
        return data

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        if self.group is not None:
            torch.distributed.destroy_process_group(self.group)
            self.group = None
