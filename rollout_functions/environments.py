"""What the adapters for other people's environments share (reasoning-gym, verifiers, ...).

An adapter runs an environment unmodified: the environment's own loop talks to the member's
router session through an OpenAI client (so the router captures its exact tokens) and its own
scorer gives the reward. An adapter module defines an `EnvAdapter` subclass and a
`generate_rollout` that hands it to `run_env`; its prompts come from the environment's own
dataset, written once as slimeish's JSONL by `python -m <adapter module> OUT --env-id ...`
(each record's `label` carries what the scorer needs).

Each ecosystem is an optional extra (`pip install 'slimeish[reasoning-gym]'`, ...): a missing
one stops `slimeish train` at start-up with the extra to install (`require_extra`).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import openai

from slimeish.common.config import help_field
from slimeish.common.sample import Sample, Status
from slimeish.data import write_prompts
from slimeish.rollout import RolloutFnEvalOutput, RolloutFnTrainOutput
from slimeish.rollout_functions.openai_agent import session_client
from slimeish.rollout_functions.sessions import Session, http_client, run_episodes


def require_extra(module: str, install: str) -> ModuleType:
    """Import an ecosystem's package, or fail naming the command that installs it (its slimeish extra)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != module.split(".")[0]:
            raise  # the package is there but broken: its own error says more
        raise ValueError(f"this environment adapter needs the `{module}` package: {install}") from None


@dataclass(kw_only=True)
class EnvConfig:
    """The flags every environment adapter takes (`--env-id`, `--env-args`)."""

    env_id: str | None = help_field(None, help="the environment to run, by its ecosystem's own name")
    env_args: dict[str, Any] = help_field({}, help="JSON object of the environment's own arguments (default: {})")

    # set by each adapter module's subclass: the package to import and the extra that installs it
    package: ClassVar[str] = ""
    extra: ClassVar[str] = ""

    @classmethod
    def install(cls) -> str:
        """How the ecosystem is installed: its extra, unless pip cannot resolve it as one."""
        return f"pip install 'slimeish[{cls.extra}]'"

    @classmethod
    def load(cls, module: str = "") -> ModuleType:
        """The ecosystem's package (or its `module`), or a start-up error naming how to install it."""
        return require_extra(module or cls.package, cls.install())

    def check(self) -> None:
        self.load()
        if not self.env_id:
            raise ValueError(f"--env-id is required: the {self.extra} environment to run")


@dataclass(frozen=True, slots=True)
class EpisodeContext:
    """Where an episode runs: the rollout call's `args`, its step, and whether it evaluates."""

    args: Any
    rollout_id: int
    evaluation: bool

    def group_size(self) -> int:
        return self.args.n_samples_per_eval_prompt if self.evaluation else self.args.n_samples_per_prompt


@dataclass(slots=True)
class Outcome:
    """What an environment's scorer gave one episode: the trained reward and its named parts."""

    reward: float
    scores: dict[str, float] = field(default_factory=dict)


class EnvAdapter(ABC):
    """One ecosystem's environments: their prompts, and one episode through a router session."""

    def __init__(self, env_id: str, env_args: dict[str, Any]) -> None:
        self.env_id = env_id
        self.env_args = env_args

    @abstractmethod
    def records(self, n: int, seed: int, split: str) -> list[dict[str, Any]]:
        """`n` prompt records (`prompt`, `label`) of the environment's `split` ("train" or "eval")."""

    @abstractmethod
    async def run(self, session: Session, sample: Sample, ctx: EpisodeContext) -> Outcome:
        """Let the environment play one episode through `session` and score it."""

    @staticmethod
    def client(session: Session) -> openai.AsyncOpenAI:
        """An OpenAI client on the session's base URL, over the rollout call's HTTP pool."""
        return session_client(session, http_client())


class Conversation:
    """One player's chat through its session: every request is the previous one plus the assistant
    message the router returned and the environment's new observations, so the router extends
    the captured tokens turn by turn and the whole episode stays one segment."""

    def __init__(self, client: openai.AsyncOpenAI, messages: list[dict[str, Any]]) -> None:
        self.client = client
        self.messages = list(messages)

    def observe(self, messages: list[dict[str, Any]]) -> None:
        self.messages.extend(messages)

    async def act(self) -> str:
        """One model turn; its text is the action."""
        reply = await self.client.chat.completions.create(model="policy", messages=self.messages)  # type: ignore[arg-type]
        message = reply.choices[0].message
        self.messages.append(message.model_dump(exclude_none=True))
        return message.content or ""


@functools.cache
def _adapter(cls: type[EnvAdapter], env_id: str, env_args_json: str) -> EnvAdapter:
    return cls(env_id, json.loads(env_args_json))


def adapter_for(cls: type[EnvAdapter], env_id: str, env_args: dict[str, Any]) -> EnvAdapter:
    """One adapter per environment and arguments for the process: building one loads its dataset."""
    return _adapter(cls, env_id, json.dumps(env_args, sort_keys=True))


def run_env(
    cls: type[EnvAdapter], args: Any, rollout_id: int, data_source: Any, evaluation: bool
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """A rollout step of an adapter: every sample one episode of the environment in its own session."""
    adapter = adapter_for(cls, args.env_id, args.env_args)
    ctx = EpisodeContext(args, rollout_id, evaluation)

    async def episode(session: Session, sample: Sample) -> Sample:
        outcome = await adapter.run(session, sample, ctx)
        sample.status = Status.COMPLETED
        sample.reward, sample.scores = float(outcome.reward), outcome.scores
        return sample

    return run_episodes(args, data_source, episode, rollout_id=rollout_id, evaluation=evaluation)


def prompts_main(cls: type[EnvAdapter], argv: list[str] | None = None) -> None:
    """An adapter module's data command: write OUT/train.jsonl and OUT/eval.jsonl from the environment."""
    parser = argparse.ArgumentParser(description=f"write prompt sets of a {cls.__name__} environment")
    parser.add_argument("out", type=Path)
    parser.add_argument("--env-id", required=True)
    parser.add_argument("--env-args", type=json.loads, default={}, help="JSON object of the environment's arguments")
    parser.add_argument("--n-train", type=int, default=64)
    parser.add_argument("--n-eval", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    ns = parser.parse_args(argv)
    adapter = cls(ns.env_id, ns.env_args)
    for split, n in (("train", ns.n_train), ("eval", ns.n_eval)):
        path = ns.out / f"{split}.jsonl"
        write_prompts(path, adapter.records(n, ns.seed, split))
        print(f"wrote {path}")
