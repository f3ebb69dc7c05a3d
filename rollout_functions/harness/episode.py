"""One harness episode: a task, an agent command, a sandbox, and a reward from the task's tests.

    create the sandbox (the task's workspace, environment/setup.sh)  -- fails: sandbox_failed
    run the agent command in /app, within the task's [agent] timeout -- killed at it: agent_timeout
                                     and its memory_mb -- killed at it: agent_out_of_memory
    grade: tests/ into a fresh sandbox holding the agent's final /app (or in place), run test.sh,
           read /logs/verifier/reward.txt (a number) or reward.json ({"reward": x})
                                                                      -- no reward: grader_failed

The outcome is a typed record. Its `kind` says whose failure it was: the agent's own outcomes
(`completed`, `agent_timeout`, `agent_out_of_memory`, `agent_error`) carry the tests' reward and
are trained on; the infrastructure's (`sandbox_failed`, `agent_start_failed` (the program exited
or was killed before its first model call), `grader_failed`) are raised as `InfrastructureFailure`, an `EpisodeLost`, so
the member is generated again in a new session and never trained as a 0.
"""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from slimeish.rollout_functions.harness.sandbox import (
    APP,
    LOGS,
    TESTS,
    ExecResult,
    Network,
    Sandbox,
    SandboxError,
    SandboxProvider,
    describe_exit,
)
from slimeish.rollout_functions.harness.tasks import Task
from slimeish.rollout_functions.sessions import EpisodeLost

PATCH_LIMIT = 64 * 1024  # characters of the workspace diff kept with the sample
GRADER_OUTPUT_LIMIT = 16 * 1024


class OutcomeKind(StrEnum):
    COMPLETED = "completed"  # the agent exited 0; the tests gave the reward
    AGENT_TIMEOUT = "agent_timeout"  # killed at the task's agent timeout; graded as it stood
    AGENT_OUT_OF_MEMORY = "agent_out_of_memory"  # killed at the task's memory limit; graded as it stood
    AGENT_ERROR = "agent_error"  # exited non-zero after talking to the model; graded as it stood
    SANDBOX_FAILED = "sandbox_failed"  # infrastructure: no sandbox, setup failed, sandbox lost
    AGENT_START_FAILED = "agent_start_failed"  # infrastructure: the program died before any model call
    GRADER_FAILED = "grader_failed"  # infrastructure: test.sh wrote no usable reward, or timed out

    @property
    def infrastructure(self) -> bool:
        return self in INFRASTRUCTURE


INFRASTRUCTURE = frozenset({OutcomeKind.SANDBOX_FAILED, OutcomeKind.AGENT_START_FAILED, OutcomeKind.GRADER_FAILED})


@dataclass(kw_only=True)
class Outcome:
    task: str
    kind: OutcomeKind
    reason: str = ""
    reward: float | None = None
    agent_exit: int | None = None
    agent_output: str = ""
    grader_exit: int | None = None
    grader_output: str = ""
    patch: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The outcome as JSON-ready metadata (`sample.metadata["harness"]`)."""
        return asdict(self) | {"kind": self.kind.value}


class InfrastructureFailure(EpisodeLost):
    """The sandbox, the program's start or the grader failed: regenerate the member, train nothing."""

    def __init__(self, outcome: Outcome):
        super().__init__(f"{outcome.kind.value}: {outcome.reason}")
        self.outcome = outcome


@dataclass(frozen=True, kw_only=True, slots=True)
class EpisodeSpec:
    task: Task
    agent_command: str
    env: dict[str, str]  # the session's URL and key, in the program's own variables
    timeout_s: float  # the agent's limit: the task's, capped by the run's
    router: tuple[str, int] | None = None  # the router's host and port: the agent reaches it with its network off
    grade_in_place: bool = False


# Whether the agent's session reached the model at least once (the router's captured turns).
ModelCalled = Callable[[], Awaitable[bool]]


async def run_episode(provider: SandboxProvider, spec: EpisodeSpec, model_called: ModelCalled) -> Outcome:
    """Run one episode to its outcome; an infrastructure outcome is raised as `InfrastructureFailure`."""
    outcome = Outcome(task=spec.task.name, kind=OutcomeKind.COMPLETED)
    with tempfile.TemporaryDirectory(prefix="slimeish-episode-") as scratch:
        sandbox = await _timed(outcome, "sandbox_create_s", _create(provider, spec.task, outcome))
        try:
            await _snapshot(sandbox, Path(scratch) / "before")
            network = Network(internet=spec.task.agent_internet, router=spec.router)
            agent = sandbox.exec(spec.agent_command, env=spec.env, timeout_s=spec.timeout_s, network=network)
            result = await _timed(outcome, "agent_s", agent)
            await _judge_agent(result, outcome, spec, model_called)
            after = Path(scratch) / "after"
            await _snapshot(sandbox, after)
            outcome.patch = (await workspace_diff(Path(scratch) / "before", after))[:PATCH_LIMIT]
            grader = sandbox if spec.grade_in_place else await _create(provider, spec.task, outcome, setup=False)
            try:
                if grader is not sandbox:
                    await grader.upload(after, APP)
                await _timed(outcome, "grade_s", _grade(grader, spec.task, outcome))
            finally:
                if grader is not sandbox:
                    await grader.destroy()
        except SandboxError as exc:  # lost mid-episode
            raise _infra(outcome, OutcomeKind.SANDBOX_FAILED, str(exc)) from exc
        finally:
            await sandbox.destroy()
    return outcome


async def _timed(outcome: Outcome, name: str, work: Awaitable[Any]) -> Any:
    started = time.monotonic()
    try:
        return await work
    finally:
        outcome.timings[name] = round(time.monotonic() - started, 3)


async def _create(provider: SandboxProvider, task: Task, outcome: Outcome, setup: bool = True) -> Sandbox:
    try:
        return await provider.create(task, setup=setup)
    except SandboxError as exc:
        raise _infra(outcome, OutcomeKind.SANDBOX_FAILED, str(exc)) from exc


async def _snapshot(sandbox: Sandbox, dest: Path) -> None:
    try:
        await sandbox.download(APP, dest)
    except OSError as exc:  # the workspace is gone: the sandbox was lost
        raise SandboxError(f"could not copy the workspace out: {exc}") from exc


async def _judge_agent(result: ExecResult, outcome: Outcome, spec: EpisodeSpec, model_called: ModelCalled) -> None:
    outcome.agent_exit, outcome.agent_output = result.exit_code, result.output[-GRADER_OUTPUT_LIMIT:]
    if result.timed_out:
        outcome.kind, outcome.reason = OutcomeKind.AGENT_TIMEOUT, f"killed at the agent timeout ({spec.timeout_s:g} s)"
    elif result.exit_code != 0:
        reason = f"the agent command {describe_exit(result, spec.task)}"
        if not await model_called():  # the program itself did not start here: nothing of the policy's to judge
            reason = f"{reason} before any model call: {result.output[-500:]}"
            raise _infra(outcome, OutcomeKind.AGENT_START_FAILED, reason)
        kind = OutcomeKind.AGENT_OUT_OF_MEMORY if result.out_of_memory else OutcomeKind.AGENT_ERROR
        outcome.kind, outcome.reason = kind, reason


async def _grade(sandbox: Sandbox, task: Task, outcome: Outcome) -> None:
    """Run tests/test.sh in `sandbox` and set the outcome's reward from the reward file it writes."""
    await sandbox.upload(task.tests, TESTS)
    with tempfile.TemporaryDirectory(prefix="slimeish-verifier-") as empty:  # no reward planted by the agent
        await sandbox.upload(Path(empty), f"{LOGS}/verifier")
    network = Network(internet=task.verifier_internet)
    command, timeout_s = 'bash "$TESTS_DIR/test.sh"', task.verifier_timeout_s
    result = await sandbox.exec(command, env=task.verifier_env, timeout_s=timeout_s, network=network)
    outcome.grader_exit, outcome.grader_output = result.exit_code, result.output[-GRADER_OUTPUT_LIMIT:]
    if result.timed_out:
        raise _infra(outcome, OutcomeKind.GRADER_FAILED, f"test.sh passed its timeout ({task.verifier_timeout_s:g} s)")
    if result.out_of_memory:
        raise _infra(outcome, OutcomeKind.GRADER_FAILED, f"test.sh {describe_exit(result, task)}")
    with tempfile.TemporaryDirectory(prefix="slimeish-verifier-") as tmp:
        await sandbox.download(f"{LOGS}/verifier", Path(tmp) / "verifier")
        reward, problem = read_reward(Path(tmp) / "verifier")
    if reward is None:
        raise _infra(outcome, OutcomeKind.GRADER_FAILED, f"{problem} (test.sh exited with {result.exit_code})")
    outcome.reward = reward


def read_reward(verifier_dir: Path) -> tuple[float | None, str]:
    """The reward Harbor's test.sh wrote: reward.txt holding a number, or reward.json holding
    {"reward": x}; else None and what was wrong."""
    txt, js = verifier_dir / "reward.txt", verifier_dir / "reward.json"
    try:
        if txt.is_file():
            value: Any = float(txt.read_text().strip())
        elif js.is_file():
            data = json.loads(js.read_text())
            value = data.get("reward") if isinstance(data, dict) else None
        else:
            return None, "test.sh wrote neither /logs/verifier/reward.txt nor reward.json"
    except ValueError as exc:  # float() or json: not a number
        return None, f"unreadable reward file: {exc}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None, f"the reward file holds {value!r}, not a finite number"
    return float(value), ""


async def workspace_diff(before: Path, after: Path) -> str:
    """What the agent changed, as a unified patch (`diff -ruN`; apply with `patch -p1` in /app)."""
    proc = await asyncio.create_subprocess_exec(
        "diff", "-ruN", before.name, after.name,
        cwd=before.parent, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    return out.decode(errors="replace")


def _infra(outcome: Outcome, kind: OutcomeKind, reason: str) -> InfrastructureFailure:
    outcome.kind, outcome.reason = kind, reason
    return InfrastructureFailure(outcome)
