"""`slimeish.rollout_functions.harness.generate_rollout`: every group member is one harness episode.

The prompt data names tasks (`tasks.py`): each sample's label is a Harbor task directory. For each
member the rollout opens its router session, runs `run_episode` (a sandbox from
`--sandbox-provider`, the `--agent-command` inside it with the session's URL and key, the task's
tests as the grader) and finishes the session with the tests' reward. The agent's own failures
(timeout, error exit) are graded and trained on; infrastructure failures are `EpisodeLost`, so
`run_groups` aborts the session and generates the member again. Per step, `episodes/harness_<kind>`
counts the outcomes (docs/harness.md).
"""

from __future__ import annotations

import functools
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from slimeish.common.config import help_field
from slimeish.common.sample import Sample, Status
from slimeish.rollout import RolloutFnEvalOutput, RolloutFnTrainOutput
from slimeish.rollout_functions.harness.docker import DockerProvider
from slimeish.rollout_functions.harness.episode import EpisodeSpec, InfrastructureFailure, OutcomeKind, run_episode
from slimeish.rollout_functions.harness.local import LocalProvider
from slimeish.rollout_functions.harness.pool import WarmPool
from slimeish.rollout_functions.harness.sandbox import SandboxProvider
from slimeish.rollout_functions.harness.tasks import load_task
from slimeish.rollout_functions.sessions import STORED_METADATA, Session, router_sessions, run_episodes

OUTCOME = "harness"  # sample.metadata key of the episode's outcome record
LOST = "harness_lost"  # sample.metadata key of the infrastructure failures the member was regenerated after


@dataclass(kw_only=True)
class HarnessConfig:
    agent_command: str | None = help_field(
        None,
        help="shell command line of the agent program, run in the sandbox's /app with OPENAI_BASE_URL, "
        "OPENAI_API_KEY (its router session) and SLIMEISH_INSTRUCTION (the task's instruction.md)",
    )
    sandbox_provider: Literal["local", "docker"] = help_field(
        "local",
        help="where episodes run: a directory on this machine (local) or a container of the Docker daemon that "
        "DOCKER_HOST names (docker); docs/harness.md",
    )
    sandbox_image: str | None = help_field(
        None, help="image of the docker provider's containers (default: the project's base image, made offline)"
    )
    sandbox_bwrap: Literal["auto", "on", "off"] = help_field(
        "auto", help="confine local sandboxes with bubblewrap: when installed (auto), required (on), or never (off)"
    )
    sandbox_root: Path | None = help_field(
        None, help="directory of the local sandboxes (default: TMPDIR/slimeish-sandboxes)"
    )
    sandbox_pool: int = help_field(
        0,
        help="sandboxes kept ready per task, their workspace laid out and setup.sh run off the episode's "
        "critical path (0: each episode creates its own)",
    )
    agent_timeout_multiplier: float = help_field(
        1.0, help="scales every task's [agent] timeout_sec (Harbor's flag: slow machines, slow-starting programs)"
    )
    grade_in_place: bool = help_field(
        False, help="run the tests in the agent's own sandbox instead of a fresh one holding its final /app"
    )

    def check(self) -> None:
        if not self.agent_command:
            raise ValueError("slimeish.rollout_functions.harness needs --agent-command")
        if self.agent_timeout_multiplier <= 0:
            raise ValueError(f"--agent-timeout-multiplier must be > 0, got {self.agent_timeout_multiplier}")
        if self.sandbox_pool < 0:
            raise ValueError(f"--sandbox-pool must be >= 0, got {self.sandbox_pool}")


ROLLOUT_CONFIG = HarnessConfig


@functools.cache
def provider_for(
    kind: str, root: Path | None, bwrap: Literal["auto", "on", "off"], image: str | None, pool: int
) -> SandboxProvider:
    """One provider per run (cached): its warm pool and memory watch serve every step."""
    provider: SandboxProvider = DockerProvider(image) if kind == "docker" else LocalProvider(root, bwrap)
    return WarmPool(provider, pool) if pool else provider


def episode_spec(args: Any, sample: Sample, session: Session) -> EpisodeSpec:
    if not isinstance(sample.label, str):
        raise ValueError(f"a harness sample's label must be its task directory, got {sample.label!r}")
    task = load_task(sample.label)
    session_env = {"OPENAI_BASE_URL": session.base_url, "OPENAI_API_KEY": session.api_key}
    return EpisodeSpec(
        task=task,
        agent_command=args.agent_command,
        env=task.agent_env | session_env | {"SLIMEISH_INSTRUCTION": task.instruction},
        timeout_s=min(task.agent_timeout_s * args.agent_timeout_multiplier, args.rollout_timeout),
        router=router_address(session.base_url),
        grade_in_place=args.grade_in_place,
    )


def router_address(base_url: str) -> tuple[str, int]:
    """The host and port the session's URL names: what a sandbox without a network still reaches."""
    url = urllib.parse.urlsplit(base_url)
    if url.hostname is None:
        raise ValueError(f"the session's base URL {base_url!r} names no host")
    return url.hostname, url.port or (443 if url.scheme == "https" else 80)


async def harness_episode(args: Any, session: Session, sample: Sample) -> Sample:
    provider = provider_for(
        args.sandbox_provider, args.sandbox_root, args.sandbox_bwrap, args.sandbox_image, args.sandbox_pool
    )

    async def model_called() -> bool:
        return await router_sessions().captured_turns(session) > 0

    try:
        outcome = await run_episode(provider, episode_spec(args, sample, session), model_called)
    except InfrastructureFailure as exc:  # recorded, then the member is generated again
        lost = exc.outcome.record()
        sample.metadata.setdefault(LOST, []).append({k: lost[k] for k in ("task", "kind", "reason", "timings")})
        sample.metadata[STORED_METADATA] = {LOST: sample.metadata[LOST]}
        raise
    sample.metadata[OUTCOME] = outcome.record()
    # kept with the member's samples in the buffer: what the viewer and `slimeish buffer export` show beside the tokens
    sample.metadata[STORED_METADATA] = {OUTCOME: sample.metadata[OUTCOME]} | {LOST: sample.metadata.get(LOST, [])}
    sample.response = outcome.agent_output
    sample.reward = outcome.reward
    sample.status = Status.COMPLETED
    return sample


def outcome_metrics(groups: list[list[Sample]]) -> dict[str, float]:
    """Per step: episodes by outcome kind, the infrastructure ones counted once per lost attempt."""
    counts = {f"harness_{kind.value}": 0.0 for kind in OutcomeKind}
    for sample in (s for g in groups for s in g):
        kinds = [lost["kind"] for lost in sample.metadata.get(LOST, [])]
        if OUTCOME in sample.metadata:
            kinds.append(sample.metadata[OUTCOME]["kind"])
        for kind in kinds:
            counts[f"harness_{kind}"] += 1
    return counts


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    async def episode(session: Session, sample: Sample) -> Sample:
        return await harness_episode(args, session, sample)

    return run_episodes(
        args, data_source, episode, rollout_id=rollout_id, evaluation=evaluation, metrics=outcome_metrics
    )
