"""TextArena games in self-play: every player is a session of the policy, a group member with its
own reward.

    python -m slimeish.rollout_functions.textarena_env DATA --env-id SimpleNegotiation-v0
    slimeish train --rollout-function-path slimeish.rollout_functions.textarena_env \\
        --env-id SimpleNegotiation-v0 --n-samples-per-prompt 2 --prompt-data DATA/train.jsonl ...

A group is one game (`ta.make(env_id)`, `reset(num_players=group size, seed=label.seed)`); its
member at index i plays player i. The members run at once and take turns: the one whose turn it
is sends TextArena's observation for it as a user message (after its first turn, only what is new
since the observation it last saw, so each request extends the player's chat) and its reply is
the action. When the game ends each player's reward is TextArena's for it (win 1, loss -1, draw 0).
A player that never got a turn (the game ended first) fails its member. The members of a game must
run together: `--rollout-concurrency` at least the players of the games in flight (a game whose
players cannot all start waits until `--rollout-timeout`), and sync mode (a reopened partial group
would replay only some players).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from slimeish.common.sample import Sample
from slimeish.rollout import RolloutFnEvalOutput, RolloutFnTrainOutput
from slimeish.rollout_functions.environments import (
    Conversation,
    EnvAdapter,
    EnvConfig,
    EpisodeContext,
    Outcome,
    prompts_main,
    run_env,
)
from slimeish.rollout_functions.sessions import Session


@dataclass(kw_only=True)
class TextArenaConfig(EnvConfig):
    package = "textarena"
    extra = "textarena"


ROLLOUT_CONFIG = TextArenaConfig


@dataclass
class Game:
    """One running game, shared by its players' episodes (one asyncio loop: the rollout call's)."""

    env: Any
    turn: tuple[int, str]  # whose turn it is, and that player's observation
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    rewards: dict[int, float] | None = None  # set when the game is over
    error: str | None = None  # a player's episode failed: the game cannot go on
    left: int = 0  # players whose episode is over


class TextArena(EnvAdapter):
    def __init__(self, env_id: str, env_args: dict[str, Any]) -> None:
        super().__init__(env_id, env_args)
        self.ta = TextArenaConfig.load()
        self.games: dict[tuple[bool, int, int | None], Game] = {}

    def records(self, n: int, seed: int, split: str) -> list[dict[str, Any]]:
        start = seed + (1_000_003 if split == "eval" else 0)
        return [{"prompt": self.env_id, "label": {"seed": start + i}} for i in range(n)]

    def _game(self, sample: Sample, ctx: EpisodeContext) -> tuple[Any, Game]:
        key = (ctx.evaluation, ctx.rollout_id, sample.group_index)
        if key not in self.games:
            env = self.ta.make(env_id=self.env_id, **self.env_args)
            env.reset(num_players=ctx.group_size(), seed=int(sample.label["seed"]))
            self.games[key] = Game(env, env.get_observation())
        return key, self.games[key]

    async def run(self, session: Session, sample: Sample, ctx: EpisodeContext) -> Outcome:
        key, game = self._game(sample, ctx)
        me, chat, seen, turns = int(sample.index or 0), Conversation(self.client(session), []), "", 0
        async with game.changed:
            try:
                while True:
                    await game.changed.wait_for(lambda: game.rewards is not None or game.error or game.turn[0] == me)
                    if game.error or game.rewards is not None:
                        break
                    observation = game.turn[1]
                    new = observation[len(seen) :] if seen and observation.startswith(seen) else observation
                    chat.observe([{"role": "user", "content": new}])
                    seen, turns = observation, turns + 1
                    done, _ = game.env.step(action=await chat.act())
                    if done:
                        rewards, _ = game.env.close()
                        game.rewards = {int(p): float(r) for p, r in rewards.items()}
                    else:
                        game.turn = game.env.get_observation()
                    game.changed.notify_all()
            except BaseException as e:
                game.error = f"player {me}: {type(e).__name__}: {e}"
                game.changed.notify_all()
                self._leave(key, game, ctx.group_size())
                raise
        self._leave(key, game, ctx.group_size())
        if game.error:
            raise RuntimeError(f"the game stopped: {game.error}")
        if turns == 0:
            raise RuntimeError(f"the game ended before player {me} had a turn: nothing of it to train on")
        assert game.rewards is not None
        return Outcome(game.rewards[me], {"turns": float(turns)})

    def _leave(self, key: tuple[bool, int, int | None], game: Game, players: int) -> None:
        """Forget the game once all its players are out of it (a late one would start a new game)."""
        game.left += 1
        if game.left == players:
            del self.games[key]


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    return run_env(TextArena, args, rollout_id, data_source, evaluation)


if __name__ == "__main__":
    prompts_main(TextArena)
