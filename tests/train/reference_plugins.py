"""Reference implementations of the three plugin hooks, written exactly as a slime user would."""

import asyncio

from slimeish.common.sample import Sample
from slimeish.rollout import RolloutFnEvalOutput, RolloutFnTrainOutput


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    groups = data_source.get_samples(args.rollout_batch_size)
    for group in groups:
        for sample in group:
            sample.response = f"echo {sample.prompt}"
            sample.reward = 1.0 if sample.label == sample.prompt else 0.0
            sample.status = Sample.Status.COMPLETED
    if evaluation:
        return RolloutFnEvalOutput(data={"eval": {"rewards": [s.reward for g in groups for s in g]}})
    return RolloutFnTrainOutput(samples=groups, metrics={"rollout_id": rollout_id})


async def generate(args, sample, sampling_params):
    sample.response = "x" * sampling_params["max_new_tokens"]
    sample.status = Sample.Status.COMPLETED
    return sample


async def reward(args, sample):
    return float(sample.response == sample.label)


def not_async_reward(args, sample):
    return 0.0


async def reward_missing_sample(args):
    return 0.0


async def first_token_parity(args, sample):
    """A reward that varies across samples (so GRPO advantages are non-zero) and needs no task."""
    return float(sample.tokens[sample.prompt_length] % 2) if sample.response_length else 0.0


async def fail_odd_groups(args, sample):
    """Fails one member of every odd group: with --failed-policy drop_group those groups are dropped."""
    if sample.group_index % 2 == 1 and sample.index == 0:
        raise RuntimeError("scripted failure")
    return await first_token_parity(args, sample)


async def no_reward(args, sample):
    return None


async def fail_every_fourth_group(args, sample):
    """Fails a member of groups 1, 5, 9, ...: a batch of 4 keeps 3 groups and needs one more."""
    if sample.group_index % 4 == 1 and sample.index == 0:
        raise RuntimeError("scripted failure")
    return await first_token_parity(args, sample)


async def slow_from_group_6(args, sample):
    """Scores groups 6 and up after 2 s, so a test can kill the run while their sessions are open."""
    if sample.group_index >= 6:
        await asyncio.sleep(2.0)
    return await first_token_parity(args, sample)


async def even_groups_all_equal(args, sample):
    """Even groups score 1.0 on every member (zero variance: a dynamic filter drops them); odd
    groups score by index, as a dict whose `acc` entry --reward-key picks."""
    if sample.group_index % 2 == 0:
        return {"acc": 1.0, "format": 1.0}
    return {"acc": float(sample.index % 2), "format": 1.0}


async def half_second(args, sample):
    """Scores every sample after 0.5 s: sessions stay open long enough for a fault to hit them."""
    await asyncio.sleep(0.5)
    return await first_token_parity(args, sample)


async def two_turn_chat_agent(client, sample):
    """An `openai` SDK agent that answers, is asked again, answers again (a two-turn episode);
    scored by the parity of its answers' length, so rewards differ within a group."""
    messages = list(sample.prompt)
    for _ in range(2):
        completion = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        messages += [completion.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
    return float(len(completion.choices[0].message.content or "") % 2)
