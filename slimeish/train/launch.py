"""Start (or connect to) the parts a run needs: buffer, engines, routers.

Every part is a separate process speaking HTTP or the Redis protocol, exactly as when the parts
run on different machines; `slimeish train` only composes them. Anything given as a URL is used
as is; anything not given is started here, as a child in its own process group, and stopped when
the `Stack` closes (also on Ctrl-C), so no process outlives the run.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx
import redis

from slimeish.common.config import help_field
from slimeish.common.files import replace_json
from slimeish.common.procs import ManagedProcess, free_port, wait_http
from slimeish.engine.protocol import ENGINE_NAME
from slimeish.train.outside import OutsideEngines
from slimeish.train.supervisor import Child, Supervisor

log = logging.getLogger("slimeish.train")


@dataclass(kw_only=True)
class StackConfig:
    buffer_url: str | None = help_field(
        None, help="redis://HOST:PORT of an existing Redis; default: start the embedded server in the run dir"
    )
    engine_url: list[str] = help_field(
        [], help="URL of an existing SGLang(-protocol) server; repeatable; default: start embedded engines"
    )
    num_engines: int = help_field(1, help="embedded engines to start when no --engine-url is given")
    engine_device: str = help_field("cpu", help="device for embedded engines (cpu or cuda)")
    num_routers: int = help_field(
        1,
        help="routers to start, each in front of every engine; new sessions are spread across them "
        "(one router process is about one core)",
    )
    router_port: int | None = help_field(None, help="the first router's port (default: a free port)")
    admin_token: str | None = help_field(None, help="router admin token (default: a fresh random token)")
    startup_timeout: float = help_field(120.0, help="seconds to wait for each part to become healthy")
    viewer_port: int | None = help_field(None, help="also serve `slimeish viewer` of this run on this port")
    max_restarts: int = help_field(
        5,
        help="restarts of one started part (buffer, engine, router) within --restart-window-s; one more ends it",
    )
    restart_window_s: float = help_field(600.0, help="the window in which --max-restarts are counted")
    engine_down_timeout: float = help_field(
        60.0,
        help="seconds every --engine-url engine may fail its /health (checked every 2 s) before the run stops "
        "with one line naming them (engines the run started are restarted instead)",
    )

    def __post_init__(self) -> None:
        if self.num_routers < 1:
            raise ValueError(f"--num-routers must be at least 1, got {self.num_routers}")


def wait_redis(url: str, timeout: float, proc: ManagedProcess | None = None) -> None:
    deadline = time.monotonic() + timeout
    with redis.Redis.from_url(url) as client:
        while time.monotonic() < deadline:
            if proc is not None and proc.proc.poll() is not None:
                raise RuntimeError(f"buffer server exited with code {proc.proc.returncode}; see {proc.log_path}")
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.1)
    raise TimeoutError(f"{url} not answering PING after {timeout:.0f}s")


def check_engine(url: str, weight_sync: str | None = None) -> str:
    """Fail early, with the fix, if an existing engine is down, reports a non-integer weight version,
    or cannot receive weights by `weight_sync`."""
    url = url.rstrip("/")
    try:
        info = httpx.get(f"{url}/model_info", timeout=10).raise_for_status().json()
    except httpx.HTTPError as exc:
        raise ValueError(f"--engine-url {url}: /model_info failed ({exc}); is the server running?") from exc
    version = info.get("weight_version")
    if version is not None and not str(version).lstrip("-").isdigit():
        raise ValueError(
            f"--engine-url {url} reports weight_version {version!r}; slimeish counts weight versions as "
            "integers: start SGLang with --weight-version 0"
        )
    if weight_sync == "tensor" and info.get("engine") != ENGINE_NAME:
        raise ValueError(
            f"--engine-url {url} is not a slimeish engine, and --weight-sync tensor hands weights over through "
            "this host's shared memory, which only slimeish's engine reads: use --weight-sync disk (a directory "
            "the engines can read) or --weight-sync distributed (NCCL, GPU engines)"
        )
    return url


def flags(**values: object) -> list[str]:
    """`--name=value` arguments: the `=` form keeps a value that starts with '-' (a random token
    can) from being read as a flag."""
    return [f"--{name.replace('_', '-')}={value}" for name, value in values.items()]


# The argv of each part, shared by the local `Stack` and the Ray launcher (`slimeish.cluster`), which
# gives "{port}" and "{host}" to fill in on the node the part lands on.
def buffer_argv(data_dir: Path, port: int | str, host: str = "127.0.0.1") -> list[str]:
    return ["buffer", "serve", *flags(dir=data_dir, port=port, host=host)]


def engine_argv(model_path: Path, port: int | str, device: str, host: str = "127.0.0.1") -> list[str]:
    return ["engine", *flags(model=model_path, port=port, device=device, host=host)]


def router_argv(
    model_path: Path, port: int | str, *, buffer_url: str, run_id: str, admin_token: str, engine_urls: list[str],
    router_id: str, host: str = "127.0.0.1", extra: Sequence[str] = (),
) -> list[str]:  # fmt: skip
    """A router's argv; `router_id` names it in the sessions it opens, so that when it restarts it
    recovers (closes and regenerates) only what its dead self held, not the other routers' sessions.
    `extra`: the flags the trainer needs of every router (`router_flags`)."""
    argv = ["router", *flags(model=model_path, port=port, buffer_url=buffer_url, run_id=run_id, host=host)]
    argv += flags(admin_token=admin_token, router_id=router_id) + [f"--engine={url}" for url in engine_urls]
    argv.append("--recover-open-sessions")
    return argv + list(extra)


def router_engines(method: str, router_url: str, engine_url: str, admin_token: str) -> None:
    """Add (POST) or remove (DELETE) `engine_url` in a router's pool; a failure is logged only:
    a router that is down too finds its engines through its own health checks."""
    headers = {"Authorization": f"Bearer {admin_token}"}
    try:
        r = httpx.request(method, f"{router_url}/admin/engines", json={"url": engine_url}, headers=headers, timeout=60)
    except httpx.HTTPError as e:
        log.warning("could not tell the router %s about %s (%s %r)", router_url, engine_url, method, e)
        return
    if r.status_code >= 400 and r.status_code != 404:
        log.warning(
            "router %s answered %s to %s of %s: %s", router_url, r.status_code, method, engine_url, r.text[:300]
        )


class RunningStack(Protocol):
    """What the loop reads of a launcher's running parts (`Stack`, `slimeish.cluster.launch.RayStack`)."""

    buffer_url: str
    engine_urls: list[str]
    admin_token: str

    @property
    def router_url(self) -> str: ...

    @property
    def router_urls(self) -> list[str]: ...

    @property
    def fatal(self) -> str | None: ...

    def raise_if_failed(self) -> None: ...


class Stack:
    """The running parts of one run; use as a context manager. Parts it started are supervised:
    restarted on the same port when they die (`slimeish.train.supervisor`)."""

    def __init__(
        self, cfg: StackConfig, *, model_path: Path, run_dir: Path, run_id: str, weight_sync: str,
        router_flags: Sequence[str] = (),
    ):  # fmt: skip
        self.cfg = cfg
        self.router_flags = list(router_flags)  # what the trainer needs every router to ask (`router_flags`)
        self.run_dir = Path(run_dir)
        self.logs = self.run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.model_path = model_path
        self.run_id = run_id
        self.weight_sync = weight_sync
        self.admin_token = cfg.admin_token or secrets.token_urlsafe(24)
        self.supervisor = Supervisor(
            max_restarts=cfg.max_restarts, restart_window_s=cfg.restart_window_s,
            on_death=self._on_death, on_restart=self._on_restart,
        )  # fmt: skip
        self.buffer_url = ""
        self.engine_urls: list[str] = []
        self.router_urls: list[str] = []
        self._closing = threading.Event()  # ends the watch of --engine-url engines

    @property
    def router_url(self) -> str:
        """The first router: slime's `sglang_router_ip/port` and the viewer point at it."""
        return self.router_urls[0] if self.router_urls else ""

    def __enter__(self) -> Stack:
        try:
            self.buffer_url = self.cfg.buffer_url or self._start_buffer()
            if self.cfg.engine_url:
                self.engine_urls = [check_engine(url, self.weight_sync) for url in self.cfg.engine_url]
                OutsideEngines(self.engine_urls, self.cfg.engine_down_timeout).watch(self._stop_run, self._closing)
            else:
                self.engine_urls = [self._start_engine(i) for i in range(self.cfg.num_engines)]
            self.router_urls = [self._start_router(i) for i in range(self.cfg.num_routers)]
            if self.cfg.viewer_port is not None:
                self._start_viewer(self.cfg.viewer_port)
        except BaseException:
            self._closing.set()
            self.supervisor.stop()
            raise
        self._write_parts()
        self.supervisor.watch()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()
        self.supervisor.stop()

    def _stop_run(self, why: str) -> None:
        self.supervisor.fatal = why

    @property
    def fatal(self) -> str | None:
        """Why the run cannot go on (a part given up), or None."""
        return self.supervisor.fatal

    def raise_if_failed(self) -> None:
        """Raise if a part the run needs is given up (see `Supervisor`)."""
        if self.supervisor.fatal is not None:
            raise RuntimeError(self.supervisor.fatal)

    def _start(self, name: str, url: str, role: str, argv: list[str], ready: Callable[[ManagedProcess], None]) -> str:
        self.supervisor.add(Child(name, url, argv, self.logs / f"{name}.log", ready, role))
        return url

    def _start_buffer(self) -> str:
        port = free_port()
        url = f"redis://127.0.0.1:{port}/0"
        argv = buffer_argv(self.run_dir / "buffer", port)
        return self._start("buffer", url, "buffer", argv, lambda proc: wait_redis(url, self.cfg.startup_timeout, proc))

    def _start_engine(self, i: int) -> str:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = engine_argv(self.model_path, port, self.cfg.engine_device)
        return self._start(f"engine{i}", url, "engine", argv, self._wait_health(url))

    def _start_router(self, i: int) -> str:
        """Router `i`; its part name is its --router-id, which the sessions it opens record."""
        port = (self.cfg.router_port if i == 0 else None) or free_port()
        url = f"http://127.0.0.1:{port}"
        name = "router" if self.cfg.num_routers == 1 else f"router{i}"
        argv = router_argv(
            self.model_path, port, buffer_url=self.buffer_url, run_id=self.run_id, admin_token=self.admin_token,
            engine_urls=self.engine_urls, router_id=name, extra=self.router_flags,
        )  # fmt: skip
        return self._start(name, url, "router", argv, self._wait_health(url))

    def _start_viewer(self, port: int) -> None:
        url = f"http://127.0.0.1:{port}"
        argv = ["viewer", *flags(buffer_url=self.buffer_url, run_dir=self.run_dir, run_id=self.run_id)]
        argv += flags(model=self.model_path, router_url=self.router_url, admin_token=self.admin_token, port=port)
        self._start(
            "viewer", url, "viewer", argv, lambda proc: wait_http(f"{url}/", self.cfg.startup_timeout, proc.proc)
        )

    def _wait_health(self, url: str) -> Callable[[ManagedProcess], None]:
        return lambda proc: wait_http(f"{url}/health", self.cfg.startup_timeout, proc.proc)

    def _on_death(self, child: Child) -> None:
        if child.role == "engine":  # out of the pool now: it must not serve before it has the current weights
            self._router_engines("DELETE", child.url)

    def _on_restart(self, child: Child) -> None:
        if child.role == "engine":  # admission loads the current weights into it first
            self._router_engines("POST", child.url)
        self._write_parts()

    def _router_engines(self, method: str, engine_url: str) -> None:
        """Tell every router, in order: the first one, which fans weight updates out, catches a
        returning engine up, so the others find it current and load nothing into it."""
        for router in self.router_urls:
            router_engines(method, router, engine_url, self.admin_token)

    def _write_parts(self) -> None:
        """`parts.json` in the run dir: each started part's URL and pid (operators, chaos tests)."""
        parts = {
            c.name: {"role": c.role, "url": c.url, "pid": c.proc.pid if c.proc else None, "restarts": len(c.restarts)}
            for c in self.supervisor.children
        }
        replace_json(self.run_dir / "parts.json", parts, indent=2)
