"""The demo agent and slimeish.rollout_functions.openai_agent against the stand-in router (conftest)."""

import asyncio
import dataclasses
import json
import re
from types import SimpleNamespace

import httpx
import openai
import pytest

from examples.demo.agent import solve
from examples.demo.task import OPS, TOOL_NAMES, Problem
from slimeish.common.sample import Sample
from slimeish.data import DataSource
from slimeish.rollout import RolloutConfig
from slimeish.rollout_functions.openai_agent import agent_episode, generate_rollout, load_agent_function
from slimeish.rollout_functions.sessions import run_groups
from tests.demo.conftest import ADMIN_TOKEN


def calculator(body):
    """Plays a perfect model: calls the tool the question asks for, then states its result."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return {"content": f"The answer is {last['content']}."}
    words = last["content"].removeprefix("What is ").removesuffix("?").split(" ")
    op = " ".join(words[1:-1])
    arguments = json.dumps({"a": int(words[0]), "b": int(words[-1])})
    call = {"id": "call_0", "type": "function", "function": {"name": OPS[op], "arguments": arguments}}
    return {"content": None, "tool_calls": [call]}


def make_args(router, **overrides):
    """The rollout config's fields, as `slimeish train` hands them to plugins, pointed at the stand-in."""
    args = dataclasses.asdict(RolloutConfig()) | dict(
        router_url=router.url, admin_token=ADMIN_TOKEN, rollout_concurrency=4, rollout_timeout=5.0,
        rollout_batch_size=2, agent_function_path="examples.demo.agent.run_agent", custom_rm_path=None,
    )  # fmt: skip
    return SimpleNamespace(**(args | overrides))


def test_demo_agent_runs_the_tool_and_answers(router):
    router.reply = calculator
    create = httpx.post(f"{router.url}/sessions", json={}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    client = openai.AsyncOpenAI(base_url=create.json()["base_url"], api_key=create.json()["api_key"])
    assert asyncio.run(solve(client, "What is 6 times 7?")) == "The answer is 42."
    (_, first), (_, second) = router.requests
    assert [t["function"]["name"] for t in first["tools"]] == list(TOOL_NAMES)
    assert "temperature" not in first  # the server (the router's session) decides
    assert second["messages"][1]["tool_calls"][0]["function"]["name"] == "mul"
    assert second["messages"][2] == {"role": "tool", "tool_call_id": "call_0", "content": "42"}


def test_unparseable_tool_call_is_a_plain_answer_worth_zero(router):
    router.reply = lambda body: {"content": '<tool_call>\n{"name": "add", "arguments": {"a": 4'}
    groups = DataSource([Sample(prompt="What is 4 plus 5?", label=9)], 2, shuffle=False).get_samples(1)
    args = make_args(router, rollout_batch_size=1, n_samples_per_prompt=2)
    out = generate_rollout(args, 0, _Source(groups), evaluation=False)
    assert [s.reward for s in out.samples[0]] == [0.0, 0.0]
    assert len(router.requests) == 2  # no tool call, so one turn per episode


class _Source:
    """Serves fixed groups the way DataSource.get_samples does."""

    def __init__(self, groups):
        self.groups = groups

    def get_samples(self, n):
        return self.groups[:n]


def test_generate_rollout_opens_and_finishes_one_session_per_sample(router):
    router.reply = calculator
    prompts = [Sample(prompt=p.question, label=p.label) for p in (Problem("plus", 4, 5), Problem("divided by", 8, 2))]
    out = generate_rollout(make_args(router, n_samples_per_prompt=3), 3, DataSource(prompts, 3, shuffle=False))
    assert [[s.reward for s in g] for g in out.samples] == [[1.0] * 3, [1.0] * 3]
    assert out.metrics["reward_mean"] == 1.0 and out.metrics["failed"] == 0
    created = sorted(
        (s["create"]["group_id"], s["create"]["index"], s["create"]["group_size"]) for s in router.sessions.values()
    )
    assert created == [(g, i, 3) for g in ("g0", "g1") for i in range(3)]
    finishes = [s["finish"] for s in router.sessions.values()]
    assert all(f["reward"] == 1.0 and f["status"] == "completed" for f in finishes)
    assert {sid for sid, _ in router.requests} == set(router.sessions)  # each agent used its own session


@pytest.mark.parametrize("evaluation, temperature", [(False, 0.8), (True, 0.0)])
def test_sessions_carry_the_rollout_sampling_for_the_agent(router, evaluation, temperature):
    """An agent that sets no sampling (the demo's) gets the eval temperature when evaluating, the
    rollout temperature otherwise, through its session's defaults."""
    router.reply = calculator
    sampling = dict(rollout_temperature=0.8, eval_temperature=0.0, rollout_top_p=0.9, rollout_top_k=20)
    args = make_args(router, rollout_batch_size=1, n_samples_per_prompt=2, **sampling)
    prompts = [Sample(prompt="What is 4 plus 5?", label=9)]
    generate_rollout(args, 0, DataSource(prompts, 2, shuffle=False), evaluation=evaluation)
    defaults = [s["create"]["sampling_defaults"] for s in router.sessions.values()]
    budget = args.rollout_max_response_len
    assert defaults == [{"temperature": temperature, "top_p": 0.9, "top_k": 20, "max_new_tokens": budget}] * 2
    assert all("temperature" not in body for _, body in router.requests)  # the session, not the agent, sets it


async def crashing_agent(client, sample):
    raise RuntimeError("agent bug")


async def hanging_agent(client, sample):
    await asyncio.sleep(30)


async def unscored_agent(client, sample):
    return None


async def scorer(args, sample):
    return 0.5


@pytest.mark.parametrize(
    "agent, rm, status, reward",
    [(crashing_agent, None, "failed", None), (hanging_agent, None, "failed", None),
     (unscored_agent, None, "failed", None), (unscored_agent, scorer, "completed", 0.5)],
)  # fmt: skip
def test_agent_failures_fail_the_session(router, agent, rm, status, reward):
    args = make_args(router, rollout_timeout=0.5, n_samples_per_prompt=1)
    groups = [[Sample(group_index=0, index=0, prompt="What is 2 plus 2?", label=4)]]

    ((sample,),) = asyncio.run(run_groups(args, groups, agent_episode(agent, args, rm), rollout_id=0, evaluation=False))
    (session,) = router.sessions.values()
    assert session["finish"]["status"] == status and session["finish"]["reward"] == reward
    assert (sample.status == Sample.Status.FAILED) == (status == "failed")


async def agent_with_its_own_limit(client, sample):
    async with asyncio.timeout(0.05):
        await asyncio.sleep(30)


@pytest.mark.parametrize(
    "agent, says",
    [(hanging_agent, r"TimeoutError: the episode passed --rollout-timeout \(0.5 s\) after \d+\.\d s"),
     (agent_with_its_own_limit, r"TimeoutError: a limit inside the generate or reward function fired after 0\.\d s")],
)  # fmt: skip
def test_a_timed_out_episode_says_which_limit_fired_and_after_how_long(router, agent, says):
    args = make_args(router, rollout_timeout=0.5, n_samples_per_prompt=1)
    groups = [[Sample(group_index=0, index=0, prompt="What is 2 plus 2?", label=4)]]
    ((sample,),) = asyncio.run(
        run_groups(args, groups, agent_episode(agent, args, None), rollout_id=0, evaluation=False)
    )
    assert re.fullmatch(says, sample.metadata["error"]), sample.metadata["error"]


def test_agent_function_signature_is_checked():
    assert load_agent_function("examples.demo.agent.run_agent")
    with pytest.raises(ValueError, match="async def agent"):
        load_agent_function("examples.demo.task.reward")
