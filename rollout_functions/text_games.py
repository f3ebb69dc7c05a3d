"""One driver for Gymnasium-style text environments (TextArena, SkyRL-Gym, GEM): reset, then each
model turn is an action, `step(action)` answers with rewards and the next observation, until the
game is over.

An ecosystem's adapter only says how to open a game (`TextGameAdapter.open`) and how its env maps
onto a `TextGame` (the observation rendered as chat messages, the step's rewards per player); the
loop is here. Each action is one model turn through the acting member's session, the observations
between turns are user (or tool) messages appended to that player's chat, so a player's whole game
is one captured, extending trajectory.

The reward of a player is its **return: the sum of its step rewards** (an environment that rewards
only the end, as TextArena does, gives its final reward; one that rewards turns, as SkyRL-Gym and
GEM do, the sum of them); `sample.scores` holds `turns` and the last step's reward.

A game has one or several players. In self-play (`self_play`), a group is one game and member i plays player
i (the members run at once and take turns on it); otherwise every member plays its own game as
player `policy_player`, and any other player is the game's own business (a fixed opponent the
adapter moves inside `step`).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from slimeish.common.sample import Sample
from slimeish.rollout_functions.environments import Conversation, EnvAdapter, EpisodeContext, Outcome
from slimeish.rollout_functions.sessions import Session

Messages = list[dict[str, Any]]


@dataclass(slots=True)
class Turn:
    """Whose move it is, and what is new for that player since its last move, as chat messages."""

    player: int
    messages: Messages


@dataclass(slots=True)
class Step:
    """What one action gave: each player's reward for it, and the next turn (None: the game is over)."""

    rewards: dict[int, float]
    next: Turn | None
    metrics: dict[str, float] = field(default_factory=dict)


class TextGame(ABC):
    """One game of an ecosystem's environment, as the driver plays it."""

    @abstractmethod
    def reset(self) -> Turn | None:
        """Start the game: the first turn (None: it ended before any member's turn)."""

    @abstractmethod
    def step(self, action: str) -> Step:
        """Play the acting player's `action`."""

    def close(self) -> None:  # noqa: B027 - most games hold nothing to release
        """Release what the game holds (called once, however it ended)."""


class GymGame(TextGame):
    """A single-player env of the Gymnasium / GEM shape: `reset(seed) -> (obs, info)`,
    `step(action) -> (obs, reward, terminated, truncated, info)`, its text `obs` a user message."""

    def __init__(self, env: Any, seed: int | None) -> None:
        self.env, self.seed = env, seed

    def reset(self) -> Turn:
        obs, _ = self.env.reset(seed=self.seed)
        return Turn(0, [{"role": "user", "content": str(obs)}])

    def step(self, action: str) -> Step:
        obs, reward, terminated, truncated, _ = self.env.step(action)
        over = bool(terminated or truncated)
        return Step({0: float(reward)}, None if over else Turn(0, [{"role": "user", "content": str(obs)}]))


@dataclass
class Table:
    """One running game and its seated members' shared view of it (one asyncio loop: the rollout call's)."""

    game: TextGame
    members: int  # the sessions playing it
    turn: Turn | None = None  # None once the game is over
    returns: dict[int, float] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)  # each player's last step reward
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # a member's episode failed: the game cannot go on
    left: int = 0  # members whose episode is over
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)


class TextGameAdapter(EnvAdapter):
    """An ecosystem of text games: `open` one game for a sample; the driver plays it."""

    def __init__(self, env_id: str, env_args: dict[str, Any]) -> None:
        super().__init__(env_id, env_args)
        self.tables: dict[tuple[bool, int, int | None, int | None], Table] = {}

    @abstractmethod
    def open(self, sample: Sample, ctx: EpisodeContext) -> TextGame:
        """A new game for `sample` (its `label` holds what the environment needs: a seed, its extras)."""

    def self_play(self, ctx: EpisodeContext) -> bool:
        """Whether a group is one game whose players are its members (else each member plays its own)."""
        return False

    def policy_player(self, ctx: EpisodeContext) -> int:
        """The player a member plays in its own game."""
        return 0

    def seed_records(self, n: int, seed: int, split: str) -> list[dict[str, Any]]:
        """Prompt records of games told apart by their seed (the eval split draws other seeds)."""
        start = seed + (1_000_003 if split == "eval" else 0)
        return [{"prompt": self.env_id, "label": {"seed": start + i}} for i in range(n)]

    def _seat(self, sample: Sample, ctx: EpisodeContext) -> tuple[tuple[bool, int, int | None, int | None], int]:
        """The sample's table (created by its first member) and the player it plays there."""
        shared = self.self_play(ctx)
        key = (ctx.evaluation, ctx.rollout_id, sample.group_index, None if shared else sample.index)
        if key not in self.tables:
            table = Table(self.open(sample, ctx), ctx.group_size() if shared else 1)
            self.tables[key] = table
            try:
                table.turn = table.game.reset()
            except BaseException as e:
                table.error = f"reset: {type(e).__name__}: {e}"
        return key, int(sample.index or 0) if shared else self.policy_player(ctx)

    async def run(self, session: Session, sample: Sample, ctx: EpisodeContext) -> Outcome:
        key, me = self._seat(sample, ctx)
        table, chat, turns = self.tables[key], Conversation(self.client(session), []), 0
        async with table.changed:
            try:
                while True:
                    await table.changed.wait_for(lambda: table.error or table.turn is None or table.turn.player == me)
                    if table.error or table.turn is None:
                        break
                    chat.observe(table.turn.messages)
                    turns += 1
                    # on a thread: a step runs the environment's code (and a fixed opponent's moves,
                    # maybe a model call), which must not stall the other sessions of this process
                    step = await asyncio.to_thread(table.game.step, await chat.act())
                    for player, reward in step.rewards.items():
                        table.returns[player] = table.returns.get(player, 0.0) + reward
                        table.last[player] = reward
                    table.metrics.update(step.metrics)
                    table.turn = step.next
                    table.changed.notify_all()
            except BaseException as e:
                table.error = f"player {me}: {type(e).__name__}: {e}"
                table.changed.notify_all()
                raise
            finally:
                self._leave(key, table)
        if table.error:
            raise RuntimeError(f"the game stopped: {table.error}")
        if turns == 0:
            raise RuntimeError(f"the game ended before player {me} had a turn: nothing of it to train on")
        scores = {"turns": float(turns), "last_step_reward": table.last.get(me, 0.0), **table.metrics}
        return Outcome(table.returns.get(me, 0.0), scores)

    def _leave(self, key: tuple[bool, int, int | None, int | None], table: Table) -> None:
        """Close and forget the game once all its members are out of it (a late one would start a new game)."""
        table.left += 1
        if table.left == table.members:
            del self.tables[key]
            table.game.close()
