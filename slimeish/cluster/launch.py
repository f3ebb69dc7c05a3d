"""`--launcher ray`: the run's buffer server, engines and routers as Ray actors (docs/cluster.md).

Each part is a `PartActor` on the node Ray picks from its role's resources (`ClusterConfig`);
the trainer stays in this process (or runs as rank actors: `slimeish.cluster.ranks`). The same
surface as the local `Stack`, so the loop does not know which launcher it runs on. A watcher
thread follows the parts: an engine whose node died is started by Ray on another node (its
actor's `max_restarts`) with a new URL, which this takes out of every router and puts the new
one in (the router loads the current weights into it first). A router or buffer whose node died
is not moved: the run stops saying so, and the same command resumes it (docs/cluster.md, "Node
death").
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

from slimeish.cluster.config import ClusterConfig, Placement
from slimeish.cluster.part import PartActor, PartSpec
from slimeish.common.files import replace_json
from slimeish.train.launch import StackConfig, buffer_argv, check_engine, engine_argv, router_argv, router_engines

log = logging.getLogger("slimeish.cluster")
POLL_S = 1.0  # how often the watcher asks each part where it is
STATUS_TIMEOUT_S = 5.0  # an actor that does not answer in this time is taken to be restarting


@dataclass
class Part:
    name: str
    role: str
    actor: Any  # a handle to a `PartActor`
    url: str = ""
    node_id: str = ""
    out: bool = False  # taken out of the routers' pools (an engine that is restarting or given up)
    given_up: bool = False
    moves: int = 0  # times Ray started it on another node


class RayStack:
    def __init__(
        self, cfg: StackConfig, cluster: ClusterConfig, *, model_path: Path, run_dir: Path, run_id: str,
        weight_sync: str, router_flags: Sequence[str] = (),
    ):  # fmt: skip
        if cfg.viewer_port is not None:
            raise ValueError(
                "--viewer-port is local only: run `slimeish viewer --buffer-url ...` beside a --launcher ray run"
            )
        self.cfg, self.cluster = cfg, cluster
        self.run_dir = Path(run_dir).resolve()  # actors on other nodes resolve paths from their own cwd
        self.model_path = Path(model_path).resolve()
        self.run_id, self.weight_sync = run_id, weight_sync
        self.router_flags = list(router_flags)  # what the trainer needs every router to ask (`router_flags`)
        self.admin_token = cfg.admin_token or secrets.token_urlsafe(24)
        self.buffer_url = ""
        self.engine_urls: list[str] = []
        self.router_urls: list[str] = []
        self.parts: list[Part] = []
        self._fatal: str | None = None
        self._owns_ray = False
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="ray-parts", daemon=True)

    @property
    def router_url(self) -> str:
        return self.router_urls[0]

    @property
    def fatal(self) -> str | None:
        return self._fatal

    def raise_if_failed(self) -> None:
        if self._fatal is not None:
            raise RuntimeError(self._fatal)

    def __enter__(self) -> RayStack:
        self._owns_ray = not ray.is_initialized()  # a program already connected keeps its connection
        if self._owns_ray:
            ray.init(address=self.cluster.ray_address, namespace="slimeish")  # None: $RAY_ADDRESS, else a local Ray
        try:
            self._start_all()
        except BaseException:
            self._stop_all()
            raise
        self._write_parts()
        self._watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_all()

    def _start_all(self) -> None:
        if self.cfg.buffer_url:
            self.buffer_url = self.cfg.buffer_url
        else:
            (self.buffer_url,) = self._start(
                "buffer", [["slimeish", *buffer_argv(self.run_dir / "buffer", "{port}", "{host}")]]
            )
        if self.cfg.engine_url:
            self.engine_urls = [check_engine(url, self.weight_sync) for url in self.cfg.engine_url]
        else:
            self.engine_urls = self._start("engine", [self._engine_argv()] * self.cfg.num_engines)
            for url in self.engine_urls:  # an engine that cannot take this run's weights fails the run now
                check_engine(url, self.weight_sync)
            self._check_tensor_sync()
        argvs = [
            ["slimeish", *router_argv(
                self.model_path, "{port}", buffer_url=self.buffer_url, run_id=self.run_id, admin_token=self.admin_token,
                engine_urls=self.engine_urls, router_id=f"router{i}", host="{host}", extra=self.router_flags,
            )]
            for i in range(self.cfg.num_routers)
        ]  # fmt: skip
        self.router_urls = self._start("router", argvs)
        for part in self._parts("engine"):
            ray.get(part.actor.set_routers.remote(self.router_urls, self.admin_token))

    def _engine_argv(self) -> list[str]:
        if self.cluster.engine_backend == "sglang":
            return sglang_argv(self.model_path, tp_size=max(1, int(self.cluster.engine_num_gpus)))
        return ["slimeish", *engine_argv(self.model_path, "{port}", self.cfg.engine_device, "{host}")]

    def _check_tensor_sync(self) -> None:
        """`--weight-sync tensor` hands weights over in the trainer host's shared memory."""
        here = ray.util.get_node_ip_address()
        elsewhere = [url for url in self.engine_urls if urlsplit(url).hostname != here]
        if self.weight_sync == "tensor" and elsewhere:
            raise ValueError(
                f"--weight-sync tensor reaches only engines on this host ({here}), and {', '.join(elsewhere)} "
                "are not: use --weight-sync disk with a --run-dir every engine node mounts, or --weight-sync "
                "distributed (NCCL, SGLang engines)"
            )

    def _start(self, role: str, argvs: list[list[str]]) -> list[str]:
        """One actor per argv, started together; their URLs once every part answers."""
        placement = Placement.of(self.cluster, role)
        # Only an engine moves to another node: a router's or the buffer's clients hold its URL.
        moves = self.cfg.max_restarts if role == "engine" else 0
        new = []
        for i, argv in enumerate(argvs):
            name = role if role == "buffer" else f"{role}{i}"
            spec = PartSpec(
                name, role, argv, "redis" if role == "buffer" else "http", self.run_dir / "logs",
                self.cfg.startup_timeout, self.cfg.max_restarts, self.cfg.restart_window_s,
            )  # fmt: skip
            options: dict[str, Any] = {
                "num_cpus": placement.num_cpus,
                "num_gpus": placement.num_gpus,
                "max_restarts": moves,
            }
            options["resources"] = placement.resources or None
            actor = ray.remote(PartActor).options(name=f"{self.run_id}/{name}", **options).remote(spec)
            new.append(Part(name, role, actor))
        self.parts += new
        try:
            statuses = ray.get([p.actor.status.remote() for p in new], timeout=self.cfg.startup_timeout)
        except GetTimeoutError:
            raise TimeoutError(
                f"the {role}s did not start within --startup-timeout {self.cfg.startup_timeout:.0f} s: is there a node "
                f"with {placement} free for each (`ray status`)? Else see RUN_DIR/logs/{role}*.log on its node"
            ) from None
        for part, status in zip(new, statuses, strict=True):
            part.url, part.node_id = status["url"], status["node_id"]
            log.info("%s on node %s at %s", part.name, part.node_id[:8], part.url)
        return [p.url for p in new]

    def _parts(self, role: str) -> list[Part]:
        return [p for p in self.parts if p.role == role]

    def _stop_all(self) -> None:
        self._stop.set()
        if self._watcher.is_alive():
            self._watcher.join()
        for part in reversed(self.parts):  # the part's process first, then its actor
            try:
                ray.get(part.actor.stop.remote(), timeout=30)
            except (RayActorError, GetTimeoutError) as e:
                log.warning("%s did not stop cleanly: %r", part.name, e)
            ray.kill(part.actor, no_restart=True)
        if self._owns_ray:
            ray.shutdown()

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            for part in self.parts:
                if not part.given_up:
                    self._check(part)

    def _check(self, part: Part) -> None:
        try:
            status = ray.get(part.actor.status.remote(), timeout=STATUS_TIMEOUT_S)
        except ActorDiedError as e:
            self._lost(part, f"{part.name}'s actor died and is not restarted ({e.__class__.__name__})")
            return
        except (RayActorError, GetTimeoutError):  # its node died: Ray is starting it elsewhere
            if part.role == "engine" and not part.out:
                log.warning("%s (%s) is unreachable: out of the routers until Ray restarts it", part.name, part.url)
                self._routers("DELETE", part.url)
                part.out = True
            return
        if status["fatal"] is not None:
            self._lost(part, status["fatal"])
        elif status["url"] != part.url:
            self._moved(part, status)

    def _moved(self, part: Part, status: dict[str, Any]) -> None:
        """An engine Ray restarted on another node: the routers get its new URL."""
        old, part.url, part.node_id, part.moves = part.url, status["url"], status["node_id"], part.moves + 1
        log.warning("%s moved to node %s: %s (was %s)", part.name, part.node_id[:8], part.url, old)
        if not part.out:
            self._routers("DELETE", old)
        ray.get(part.actor.set_routers.remote(self.router_urls, self.admin_token))
        self._routers("POST", part.url)  # the router loads the current weights into it before it serves
        part.out = False
        self.engine_urls = [part.url if url == old else url for url in self.engine_urls]
        self._write_parts()

    def _lost(self, part: Part, why: str) -> None:
        """The local rule: the run goes on without a given-up engine while another is up; any other
        lost part stops it."""
        part.given_up = True
        engines_up = [p for p in self._parts("engine") if not p.given_up]
        if part.role == "engine" and engines_up:
            log.error("%s; giving it up, the run goes on with %d engine(s)", why, len(engines_up))
            if not part.out:
                self._routers("DELETE", part.url)
                part.out = True
            return
        log.error("%s; stopping the run", why)
        hint = "" if part.role == "engine" else "; run the same command again to resume (docs/cluster.md)"
        self._fatal = self._fatal or why + hint

    def _routers(self, method: str, engine_url: str) -> None:
        for router in self.router_urls:
            router_engines(method, router, engine_url, self.admin_token)

    def _write_parts(self) -> None:
        """`parts.json` in the run dir: each part's URL and Ray node (operators, tests)."""
        parts: dict[str, Any] = {
            p.name: {"role": p.role, "url": p.url, "node_id": p.node_id, "moves": p.moves} for p in self.parts
        }
        parts["trainer"] = {"role": "trainer", "node_id": ray.get_runtime_context().get_node_id()}
        replace_json(self.run_dir / "parts.json", parts, indent=2)


def sglang_argv(model_path: Path, *, tp_size: int) -> list[str]:
    """SGLang's server on the GPUs Ray gave the actor (CUDA_VISIBLE_DEVICES), counting weight
    versions from 0 as slimeish does."""
    return [
        "sglang.launch_server", "--model-path", str(model_path), "--host", "{host}", "--port", "{port}",
        "--tp-size", str(tp_size), "--weight-version", "0",
    ]  # fmt: skip
