"""Run an in-process `openai` SDK agent per episode, pointed at its router session.

The user writes `async def agent(client: openai.AsyncOpenAI, sample) -> float | None` (named by
`--agent-function-path`). For every sample this opens a router session, hands the agent an
`openai.AsyncOpenAI` client whose base_url and api_key are the session's, and lets it run its own
loop, tools included; the router captures every turn. The agent returns the reward, or None to
leave scoring to `--custom-rm-path` (`async def reward(args, sample) -> float`). An exception, a
timeout (`--rollout-timeout`) or a missing reward fails the episode; the buffer's group policy
decides what happens to its group. `--rollout-concurrency` bounds the agents running at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai

from slimeish.common.plugins import load_function
from slimeish.common.sample import Sample
from slimeish.rollout import RolloutFnEvalOutput, RolloutFnTrainOutput, load_reward_function
from slimeish.rollout_functions.sessions import (
    EpisodeFn,
    Session,
    episode_groups,
    http_client,
    rollout_output,
    run_groups,
)

AGENT_SIGNATURE = "async def agent(client: openai.AsyncOpenAI, sample: Sample) -> float | None"
AgentFn = Callable[[openai.AsyncOpenAI, Sample], Awaitable[float | None]]
RewardFn = Callable[[Any, Sample], Awaitable[float]]


class NoRewardError(RuntimeError):
    pass


def load_agent_function(path: str) -> AgentFn:
    return load_function(path, expected=AGENT_SIGNATURE, params=["client", "sample"], is_async=True)


def session_client(session: Session, http_client: httpx.AsyncClient) -> openai.AsyncOpenAI:
    """An SDK client for one session over the shared HTTP pool.

    No SDK retries: a retried request could be captured twice, and a failed turn should fail
    the episode visibly rather than be papered over.
    """
    return openai.AsyncOpenAI(
        base_url=session.base_url, api_key=session.api_key, http_client=http_client, max_retries=0
    )


def agent_episode(agent: AgentFn, args: Any = None, rm: RewardFn | None = None) -> EpisodeFn:
    """The episode function for `run_groups`: run the agent, then score with its reward or `rm`.
    The agent's SDK client shares the rollout call's HTTP pool (`sessions.http_client()`)."""

    async def episode(session: Session, sample: Sample) -> Sample:
        reward = await agent(session_client(session, http_client()), sample)
        sample.status = Sample.Status.COMPLETED
        if reward is None and rm is not None:
            reward = await rm(args, sample)
        if reward is None:
            raise NoRewardError("the agent returned None and no --custom-rm-path is set")
        sample.reward = float(reward)
        return sample

    return episode


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    if not args.agent_function_path:
        raise ValueError("slimeish.rollout_functions.openai_agent needs --agent-function-path")
    agent = load_agent_function(args.agent_function_path)
    rm = load_reward_function(args.custom_rm_path) if args.custom_rm_path else None
    groups = episode_groups(args, data_source, evaluation)
    episode = agent_episode(agent, args, rm)
    groups = asyncio.run(run_groups(args, groups, episode, rollout_id=rollout_id, evaluation=evaluation))
    return rollout_output(groups, evaluation)
