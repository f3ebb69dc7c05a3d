"""Where agent episodes run: in the rollout's own process (`local`), or as Ray tasks (`ray`).

With `--agent-workers ray` the driver still opens and finishes every session; only the agent's
part of the episode (an async function and its arguments, e.g. the external command and its
verifier) runs in a Ray task, on a node Ray picks by the episode's resources (`--agent-num-cpus`,
`--agent-resources`, optional `--agent-runtime-env`). `ray` is imported only then, so slimeish
runs without it (`pip install 'slimeish[ray]'`).

Semantics are the local ones: `--rollout-concurrency` bounds the tasks in flight (the driver
holds an episode slot while its task runs), `--rollout-timeout` cancels the task, and a crashed
agent fails the episode. A worker or node that dies under the task is not the agent's failure:
it is raised as `EpisodeLost`, and `run_groups` aborts the session (freeing its group place) and
runs the episode again in a new session, on whichever node Ray picks. Ray never retries a task
itself (`max_retries=0`): the session already captured the first attempt's turns, and a second
attempt would add its turns to the same session.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from slimeish.common.config import help_field
from slimeish.rollout_functions.sessions import EpisodeLost

T = TypeVar("T")

# A cancelled task gets KeyboardInterrupt (Ray sends it again while the task runs on), so that
# it cancels its coroutine, which kills the command's process group; a task still running
# after this long is force-killed, which costs its worker (the command's group still goes:
# `guarded_shell`).
CANCEL_GRACE_S = 30.0
POLL_S = 0.2  # how often a task's loop wakes up to notice a cancellation


@dataclass(kw_only=True)
class AgentWorkersConfig:
    agent_workers: Literal["local", "ray"] = help_field(
        "local", help="where agent episodes run: in this process, or as Ray tasks across the cluster"
    )
    agent_num_cpus: float = help_field(1.0, help="CPUs each agent episode's Ray task asks for (--agent-workers ray)")
    agent_resources: dict[str, float] = help_field(
        {}, help="custom Ray resources per agent episode, a JSON object such as '{\"agents\": 0.01}'"
    )
    agent_runtime_env: dict[str, Any] = help_field(
        {}, help="Ray runtime_env of the agent tasks, a JSON object (working_dir, pip, env_vars, ...)"
    )

    def check(self) -> None:
        if self.agent_workers == "ray" and importlib.util.find_spec("ray") is None:
            raise ValueError("--agent-workers ray needs Ray: pip install 'slimeish[ray]'")
        if self.agent_num_cpus < 0:
            raise ValueError(f"--agent-num-cpus must be >= 0, got {self.agent_num_cpus}")
        objects = {"--agent-resources": self.agent_resources, "--agent-runtime-env": self.agent_runtime_env}
        for flag, value in objects.items():
            if not isinstance(value, dict):
                raise ValueError(f"{flag} must be a JSON object, got {value!r}")
        for name, amount in self.agent_resources.items():
            if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
                raise ValueError(f"--agent-resources: {name!r} must be a number >= 0, got {amount!r}")


def workers_of(args: Any) -> RayWorkers | None:
    """The Ray workers the rollout's flags ask for, connected; None to run episodes locally."""
    if getattr(args, "agent_workers", "local") == "local":
        return None
    cfg = AgentWorkersConfig(
        agent_workers=args.agent_workers,
        agent_num_cpus=args.agent_num_cpus,
        agent_resources=args.agent_resources,
        agent_runtime_env=args.agent_runtime_env,
    )
    cfg.check()
    with _lock:  # one per process and config: the async producer calls from several threads
        key = repr(cfg)
        if key not in _workers:
            connect(getattr(args, "ray_address", None))  # the core --ray-address (slimeish.cluster)
            _workers[key] = RayWorkers(cfg)
        return _workers[key]


_lock = threading.Lock()
_workers: dict[str, RayWorkers] = {}


def connect(address: str | None) -> None:
    """Connect this process to the Ray cluster unless it is already (`slimeish train --launcher ray`)."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)


class RayWorkers:
    """Runs an episode's async agent function as a Ray task with the configured resources."""

    def __init__(self, cfg: AgentWorkersConfig):
        import ray

        options: dict[str, Any] = {"num_cpus": cfg.agent_num_cpus, "max_retries": 0}
        if cfg.agent_resources:
            options["resources"] = cfg.agent_resources
        if cfg.agent_runtime_env:
            options["runtime_env"] = cfg.agent_runtime_env
        self._task = ray.remote(_run_in_task).options(**options)

    async def run(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> tuple[T, str]:
        """`await fn(*args)` in a Ray task: its result and the id of the node it ran on. The
        task's exception is raised as itself; a worker or node that died under it, as `EpisodeLost`."""
        import ray

        ref = self._task.remote(fn, *args)
        try:
            return await _result(ref)
        except asyncio.CancelledError:  # the episode's timeout, or the run stopping
            await _cancel(ref)
            raise
        except ray.exceptions.RayTaskError as e:
            raise e.cause from None
        except _lost_errors() as e:
            raise EpisodeLost(f"{type(e).__name__}: {e}") from e


def _lost_errors() -> tuple[type[Exception], ...]:
    """Ray's errors for a task whose worker, node or actor died: its infrastructure, not its agent."""
    import ray

    errors = ray.exceptions
    return (errors.NodeDiedError, errors.WorkerCrashedError, errors.ActorDiedError)


async def _result(ref: Any) -> Any:
    return await asyncio.wrap_future(ref.future())


async def _cancel(ref: Any) -> None:
    import ray

    ended = asyncio.ensure_future(_result(ref))
    ended.add_done_callback(lambda f: f.cancelled() or f.exception())  # its outcome is not the episode's
    ray.cancel(ref)
    try:
        await asyncio.wait([ended], timeout=CANCEL_GRACE_S)
    finally:
        if not ended.done():  # stuck where KeyboardInterrupt cannot reach it, or the run stopped waiting
            ray.cancel(ref, force=True)


def _run_in_task(fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> tuple[T, str]:
    """The Ray task's body: run the coroutine in a loop of its own that wakes every `POLL_S`, so
    that Ray's cancellation (KeyboardInterrupt in this thread) cancels the coroutine cleanly."""
    import ray

    loop = asyncio.new_event_loop()
    task = loop.create_task(fn(*args))
    try:
        while not task.done():
            loop.run_until_complete(asyncio.wait([task], timeout=POLL_S))
    except KeyboardInterrupt:
        task.cancel()
        while not task.done():
            with contextlib.suppress(KeyboardInterrupt):  # Ray's cancel sent again: this one is under way
                loop.run_until_complete(asyncio.wait([task]))
        raise
    finally:
        loop.close()
    return task.result(), ray.get_runtime_context().get_node_id()
