"""One part of a run (buffer server, engine, router) as a subprocess inside a Ray actor.

The actor starts the part on the node Ray placed it on, bound to that node's IP, and keeps it up
with the local launcher's rules (`slimeish.train.supervisor`): a part that dies is restarted on
the same port. If the node itself dies, Ray starts the actor again elsewhere (its `max_restarts`):
the part comes back with a new URL, which the launcher reads from `status` (`slimeish.cluster.launch`).
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import ray

from slimeish.common.procs import ManagedProcess, wait_http
from slimeish.train.launch import router_engines, wait_redis
from slimeish.train.supervisor import Child, Supervisor


@dataclass(frozen=True)
class PartSpec:
    name: str  # engine0, router1, buffer
    role: str  # engine, router or buffer
    argv: list[str]  # `python -m ARGV...` (slimeish's parts, SGLang), with {host} and {port} still to fill in
    scheme: str  # http or redis
    log_dir: Path
    startup_timeout: float
    max_restarts: int  # of the process on its node, within restart_window_s
    restart_window_s: float


class PartActor:
    def __init__(self, spec: PartSpec):
        self.spec = spec
        host = ray.util.get_node_ip_address()
        port = free_port(host)
        self.url = f"{spec.scheme}://{host}:{port}" + ("/0" if spec.scheme == "redis" else "")
        self.routers: list[str] = []  # an engine's routers, told when it dies and comes back
        self.admin_token = ""
        self.supervisor = Supervisor(
            max_restarts=spec.max_restarts, restart_window_s=spec.restart_window_s,
            on_death=lambda child: self._tell_routers("DELETE"), on_restart=lambda child: self._tell_routers("POST"),
        )  # fmt: skip
        argv = [arg.format(host=host, port=port) for arg in spec.argv]
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = spec.log_dir / f"{spec.name}.log"
        self.supervisor.add(ModuleChild(spec.name, self.url, argv, log_path, self._ready, spec.role))
        self.supervisor.watch()

    def status(self) -> dict[str, str | None]:
        """Where the part answers, on which node, and why it was given up (None while it is kept up)."""
        return {"url": self.url, "node_id": ray.get_runtime_context().get_node_id(), "fatal": self.supervisor.fatal}

    def set_routers(self, router_urls: list[str], admin_token: str) -> None:
        self.routers, self.admin_token = router_urls, admin_token

    def stop(self) -> None:
        self.supervisor.stop()

    def _ready(self, proc: ManagedProcess) -> None:
        if self.spec.scheme == "redis":
            wait_redis(self.url, self.spec.startup_timeout, proc)
        else:
            wait_http(f"{self.url}/health", self.spec.startup_timeout, proc.proc)

    def _tell_routers(self, method: str) -> None:
        # An engine out of the pool while down; re-admitted (current weights loaded first) once back.
        if self.spec.role == "engine":
            for router in self.routers:
                router_engines(method, router, self.url, self.admin_token)


class ModuleChild(Child):
    """A part run as `python -m ARGV...` with this node's interpreter: slimeish, or SGLang's server."""

    def start(self) -> ManagedProcess:
        self.proc = ManagedProcess([sys.executable, "-m", *self.argv], log_path=self.log_path)
        return self.proc


def free_port(host: str) -> int:
    """A TCP port free on `host` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
