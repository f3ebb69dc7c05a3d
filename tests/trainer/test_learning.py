"""GRPO learns: engine rollouts -> buffer -> trainer -> weight sync, until the reward rises.

The toy task: reward = fraction of response tokens with id < TARGET_BELOW (about 10 % of the
vocabulary at random initialisation). Every step samples groups from the embedded engine
(temperature 1), writes them to the real buffer as sessions and turns, takes complete groups,
trains one GRPO step, acknowledges them and pushes the new weights to the engine.
"""

from __future__ import annotations

import asyncio
import uuid

import httpx

from slimeish.buffer import Buffer, EmbeddedServer, SessionInfo, Turn
from slimeish.trainer.config import LossConfig, TrainerConfig
from slimeish.trainer.trainer import Trainer
from slimeish.trainer.weight_sync import WeightSync, WeightSyncConfig

TARGET_BELOW = 83
PROMPTS = [[1, 30 + g, 31 + g, 32 + g] for g in range(4)]
GROUP_SIZE, NEW_TOKENS, STEPS = 4, 8, 14


def reward(output_ids: list[int]) -> float:
    return sum(t < TARGET_BELOW for t in output_ids) / len(output_ids)


async def rollout(client: httpx.AsyncClient, engine: str, buf: Buffer, step: int, g: int, i: int) -> float:
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 1.0, "sampling_seed": step * 100 + g * 10 + i}
    body = {"input_ids": PROMPTS[g], "return_logprob": True, "sampling_params": params}
    reply = (await client.post(f"{engine}/generate", json=body)).raise_for_status().json()
    meta, sid = reply["meta_info"], f"s{step}-{g}-{i}"
    await buf.open_session(SessionInfo(session_id=sid, group_id=f"g{step}-{g}", index=i, group_size=GROUP_SIZE))
    await buf.append_turn(
        Turn(session_id=sid, turn_index=0, segment_index=0, split_reason=None, prompt_ids=PROMPTS[g],
             output_ids=reply["output_ids"], output_logprobs=[lp for lp, _, _ in meta["output_token_logprobs"]],
             weight_versions=[int(meta["weight_version"])], engine=engine, finish_reason=meta["finish_reason"]["type"])
    )  # fmt: skip
    r = reward(reply["output_ids"])
    await buf.finish_session(sid, r, "completed")
    return r


async def test_grpo_raises_reward_through_buffer_and_engine(tiny_model, engine_factory, tmp_path):
    engine = engine_factory(tiny_model)
    trainer = Trainer(TrainerConfig(model_path=tiny_model, lr=5e-2, seed=0), LossConfig(advantage_estimator="grpo"))
    sync = WeightSync(WeightSyncConfig(engine_urls=[engine], method="tensor"))
    rewards = []
    with EmbeddedServer(tmp_path / "valkey") as server:
        async with Buffer(server.url, f"learn-{uuid.uuid4().hex[:8]}") as buf, httpx.AsyncClient(timeout=60) as client:
            for step in range(STEPS):
                jobs = [
                    rollout(client, engine, buf, step, g, i) for g in range(len(PROMPTS)) for i in range(GROUP_SIZE)
                ]
                rewards.append(sum(await asyncio.gather(*jobs)) / len(jobs))
                groups = (await buf.take_groups(len(PROMPTS), "trainer", current_version=trainer.weight_version)).groups
                assert len(groups) == len(PROMPTS)
                samples = [s for g in groups for s in g.samples]
                metrics = trainer.train_step(samples)
                assert abs(metrics["rollout_kl"]) < 1e-4  # every step trains on its own engine's samples
                await buf.ack([g.group_id for g in groups])
                sync.sync(trainer)
    sync.close()
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    print("rewards per step:", [round(r, 3) for r in rewards])
    assert last > first + 0.3, rewards
