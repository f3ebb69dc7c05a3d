"""TextArena games, played by the text-game driver (`text_games`): in self-play every player is a
session of the policy, a group member with its own reward; against a fixed opponent only the
policy's player is.

    python -m slimeish.rollout_functions.textarena_env DATA --env-id SimpleNegotiation-v0
    slimeish train --rollout-function-path slimeish.rollout_functions.textarena_env \\
        --env-id SimpleNegotiation-v0 --n-samples-per-prompt 2 --prompt-data DATA/train.jsonl ...
    slimeish train ... --env-id TicTacToe-v0 --opponent random

Self-play (no `--opponent`): a group is one game (`ta.make(env_id)`, `reset(num_players=group size,
seed=label.seed)`); its member at index i plays player i. The members run at once and take turns:
the one whose turn it is sends what is new in its TextArena observation as a user message and its
reply is the action. A player that never got a turn (the game ended first) fails its member. The
members of a game must run together: `--rollout-concurrency` at least the players of the games in
flight (a game whose players cannot all start waits until `--rollout-timeout`), and sync mode (a
reopened partial group would replay only some players).

Fixed opponent (`--opponent`): every member plays its own game as player `--policy-player`
(default 0) of `--num-players` (default 2); the other players are moved by the opponent inside the
game's step, uncaptured (`opponent_moves` in the member's scores).
TextArena ships no scripted agent (its agents call hosted models), so `random` is slimeish's: a
uniform pick among the bracketed moves the game's latest message lists (TicTacToe's "Available
Moves: '[0]', '[4]'", ...), seeded by the game's seed; any other policy is a `module:function`
taking (player id, observation) and returning the action.

The reward is TextArena's at the end of the game (win 1, loss -1, draw 0).
"""

from __future__ import annotations

import importlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slimeish.common.config import help_field
from slimeish.common.sample import Sample
from slimeish.rollout import RolloutFnEvalOutput, RolloutFnTrainOutput
from slimeish.rollout_functions.environments import EnvConfig, EpisodeContext, prompts_main, run_env
from slimeish.rollout_functions.text_games import Step, TextGame, TextGameAdapter, Turn


@dataclass(kw_only=True)
class TextArenaConfig(EnvConfig):
    package = "textarena"
    extra = "textarena"

    opponent: str | None = help_field(
        None,
        help="the other players are this fixed policy and only --policy-player is the policy's: `random` (a "
        "uniform pick among the bracketed moves the game lists) or `module:function` (player id, "
        "observation) -> action; unset: self-play, every player a group member",
    )
    num_players: int = help_field(2, help="players of a game against --opponent (self-play: the group size)")
    policy_player: int = help_field(0, help="the player the policy plays against --opponent")

    def check(self) -> None:
        super().check()
        if self.opponent is not None:
            opponent_policy(self.opponent, 0)  # a bad module:function fails at start-up
            if not 0 <= self.policy_player < self.num_players:
                raise ValueError(
                    f"--policy-player {self.policy_player} is no player of a {self.num_players}-player game"
                )


ROLLOUT_CONFIG = TextArenaConfig

Opponent = Callable[[int, str], str]
# a move as TextArena games write them: `[4]`, `[Accept]`; not a speaker tag (`[GAME]`, `[Player 1]`)
_MOVE = re.compile(r"\[(?!GAME\]|Player \d+\])[^\[\]\n]+\]")


def random_opponent(seed: int) -> Opponent:
    rng = random.Random(seed)

    def move(player: int, observation: str) -> str:
        moves = sorted(set(_MOVE.findall(observation.rsplit("[GAME]", 1)[-1])))
        if not moves:
            raise ValueError(
                f"--opponent random: the game's latest message lists no bracketed moves for player {player}; "
                "use a module:function opponent for this game"
            )
        return rng.choice(moves)

    return move


def opponent_policy(spec: str, seed: int) -> Opponent:
    """The fixed policy `--opponent` names, for a game of `seed`."""
    if spec == "random":
        return random_opponent(seed)
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"--opponent must be `random` or `module:function`, got {spec!r}")
    try:
        policy: Opponent = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--opponent {spec!r}: {type(e).__name__}: {e}") from None
    return policy


class TextArenaGame(TextGame):
    """A TextArena env; `members` are the players the driver's sessions play, the others `opponent`'s."""

    def __init__(self, env: Any, players: int, seed: int, members: set[int], opponent: Opponent | None) -> None:
        self.env, self.players, self.seed, self.members, self.opponent = env, players, seed, members, opponent
        self.seen: dict[int, str] = {}  # each member's observation at its last turn
        self.opponent_moves = 0

    def reset(self) -> Turn | None:
        self.env.reset(num_players=self.players, seed=self.seed)
        return self._next().next

    def step(self, action: str) -> Step:
        done, _ = self.env.step(action=action)
        return self._over() if done else self._next()

    def _next(self) -> Step:
        """The next member's turn, the opponent moving the players in between."""
        while True:
            player, observation = self.env.get_observation()
            if player in self.members:
                seen = self.seen.get(player, "")
                new = observation[len(seen) :] if seen and observation.startswith(seen) else observation
                self.seen[player] = observation
                return Step({}, Turn(player, [{"role": "user", "content": new}]))
            assert self.opponent is not None, f"player {player} is no member's and there is no opponent"
            done, _ = self.env.step(action=self.opponent(player, observation))
            self.opponent_moves += 1
            if done:
                return self._over()

    def _over(self) -> Step:
        rewards, _ = self.env.close()
        metrics = {"opponent_moves": float(self.opponent_moves)} if self.opponent else {}
        return Step({int(p): float(r) for p, r in rewards.items()}, None, metrics)


class TextArena(TextGameAdapter):
    def __init__(self, env_id: str, env_args: dict[str, Any]) -> None:
        super().__init__(env_id, env_args)
        self.ta = TextArenaConfig.load()

    def records(self, n: int, seed: int, split: str) -> list[dict[str, Any]]:
        return self.seed_records(n, seed, split)

    def open(self, sample: Sample, ctx: EpisodeContext) -> TextGame:
        env, seed = self.ta.make(env_id=self.env_id, **self.env_args), int(sample.label["seed"])
        if ctx.args.opponent is None:
            players = ctx.group_size()
            return TextArenaGame(env, players, seed, set(range(players)), None)
        opponent = opponent_policy(ctx.args.opponent, seed)
        return TextArenaGame(env, ctx.args.num_players, seed, {self.policy_player(ctx)}, opponent)

    def self_play(self, ctx: EpisodeContext) -> bool:
        return ctx.args.opponent is None

    def policy_player(self, ctx: EpisodeContext) -> int:
        return int(ctx.args.policy_player)


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    return run_env(TextArena, args, rollout_id, data_source, evaluation)


if __name__ == "__main__":
    prompts_main(TextArena)
