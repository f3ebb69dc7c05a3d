"""Run an in-process `openai` SDK agent per episode, pointed at its router session.

The user writes `async def agent(client: openai.AsyncOpenAI, sample) -> float | None` (named by
`--agent-function-path`). For every sample this opens a router session, hands the agent an
`openai.AsyncOpenAI` client whose base_url and api_key are the session's, and lets it run its own
loop, tools included; the router captures every turn. The agent returns the reward, or None to
leave scoring to `--custom-rm-path` (`async def reward(args, sample) -> float`). An exception, a
timeout (`--rollout-timeout`) or a missing reward fails the episode; the buffer's group policy
decides what happens to its group. `--rollout-concurrency` bounds the agents running at once.
With `--agent-workers ray` the agent runs in a Ray task on the cluster (`agent_workers`), with a
client of its own pointed at the same session; the reward function still runs here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from slimeish.common.config import help_field
from slimeish.common.plugins import load_function
from slimeish.common.sample import Sample, Status
from slimeish.rollout import RolloutFnEvalOutput, RolloutFnTrainOutput, load_reward_function
from slimeish.rollout_functions.agent_workers import AgentWorkersConfig, RayWorkers, workers_of
from slimeish.rollout_functions.sessions import EpisodeFn, Session, checked_reward, http_client, run_episodes

AGENT_SIGNATURE = "async def agent(client: openai.AsyncOpenAI, sample: Sample) -> float | None"
AgentFn = Callable[[openai.AsyncOpenAI, Sample], Awaitable[float | None]]
RewardFn = Callable[[Any, Sample], Awaitable[float]]


class NoRewardError(RuntimeError):
    pass


def load_agent_function(path: str) -> AgentFn:
    return load_function(path, expected=AGENT_SIGNATURE, params=["client", "sample"], is_async=True)


@dataclass(kw_only=True)
class OpenAIAgentConfig(AgentWorkersConfig):
    agent_function_path: str | None = help_field(None, help=f"the agent run per episode: {AGENT_SIGNATURE}")

    def check(self) -> None:
        super().check()
        if self.agent_function_path:
            load_agent_function(self.agent_function_path)


ROLLOUT_CONFIG = OpenAIAgentConfig


def session_client(session: Session, http_client: httpx.AsyncClient) -> openai.AsyncOpenAI:
    """An SDK client for one session over the shared HTTP pool.

    No SDK retries: a retried request could be captured twice, and a failed turn should fail
    the episode visibly rather than be papered over.
    """
    return openai.AsyncOpenAI(
        base_url=session.base_url,
        api_key=session.api_key,
        # openai annotates its pool as httpx2's client; httpx's AsyncClient serves it the same way.
        http_client=http_client,  # type: ignore[arg-type]
        max_retries=0,
    )


def agent_episode(
    agent: AgentFn, args: Any = None, rm: RewardFn | None = None, workers: RayWorkers | None = None
) -> EpisodeFn:
    """The episode function for `run_groups`: run the agent, then score with its reward or `rm`.
    Locally the agent's SDK client shares the rollout call's HTTP pool (`sessions.http_client()`);
    with `workers` the agent runs in a Ray task (`remote_agent`) and its sample comes back."""

    async def episode(session: Session, sample: Sample) -> Sample:
        if workers is None:
            reward: object = await agent(session_client(session, http_client()), sample)
        else:
            (reward, sample), node_id = await workers.run(remote_agent, _name(agent), session, sample)
            sample.metadata["agent_node_id"] = node_id
        sample.status = Status.COMPLETED
        source = f"the agent {_name(agent)}"
        if reward is None and rm is not None:
            reward, source = await rm(args, sample), f"the reward function {_name(rm)}"
        if reward is None:
            raise NoRewardError("the agent returned None and no --custom-rm-path is set")
        sample.reward = checked_reward(reward, source)
        return sample

    return episode


async def remote_agent(agent_path: str, session: Session, sample: Sample) -> tuple[object, Sample]:
    """A Ray task's part of an episode: the agent, loaded by its path, on a client of its own for
    the session (the episode's timeout bounds it). Returns its reward and the sample it filled."""
    agent = load_agent_function(agent_path)
    async with httpx.AsyncClient(timeout=None) as client:
        reward = await agent(session_client(session, client), sample)
    return reward, sample


def _name(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    if not args.agent_function_path:
        raise ValueError("slimeish.rollout_functions.openai_agent needs --agent-function-path")
    agent = load_agent_function(args.agent_function_path)
    rm = load_reward_function(args.custom_rm_path) if args.custom_rm_path else None
    episode = agent_episode(agent, args, rm, workers_of(args))
    return run_episodes(args, data_source, episode, rollout_id=rollout_id, evaluation=evaluation)
