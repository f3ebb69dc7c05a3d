"""Run any external agent command per episode, pointed at its router session.

The command (`--agent-command`, a shell command line) runs with `OPENAI_BASE_URL` and
`OPENAI_API_KEY` set to the episode's session, plus `SLIMEISH_PROMPT` (JSON) and
`SLIMEISH_LABEL` (JSON). Its reward is the last line of its stdout if that is a JSON object with
a numeric "reward"; otherwise `--verifier-command` runs with the same environment and the agent's
stdout on stdin, and must print such a line. Timeouts (`--rollout-timeout`), crashes and missing
or malformed rewards fail the episode; the buffer's group policy decides what happens to its group.
`--rollout-concurrency` bounds the commands running at once. With `--agent-workers ray` the
command and its verifier run in a Ray task on the cluster (`agent_workers`), with the same
environment, reward and failure rules.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
from dataclasses import dataclass
from typing import Any

from slimeish.common.child_output import collecting
from slimeish.common.config import help_field
from slimeish.common.procs import guarded_shell
from slimeish.common.sample import Sample, Status
from slimeish.rollout import RolloutFnEvalOutput, RolloutFnTrainOutput
from slimeish.rollout_functions.agent_workers import AgentWorkersConfig, workers_of
from slimeish.rollout_functions.sessions import Session, run_episodes


@dataclass(kw_only=True)
class AgentCommandConfig(AgentWorkersConfig):
    agent_command: str | None = help_field(
        None, help="shell command run per episode (OPENAI_BASE_URL/KEY set to its router session)"
    )
    verifier_command: str | None = help_field(None, help="shell command that prints the reward when the agent does not")


ROLLOUT_CONFIG = AgentCommandConfig


class AgentCommandError(RuntimeError):
    pass


def parse_reward(stdout: str) -> float | None:
    """The "reward" of the last non-empty stdout line if it is a JSON object, else None."""
    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    if not lines:
        return None
    try:
        obj = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    reward = obj.get("reward") if isinstance(obj, dict) else None
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return None
    return float(reward)


async def run_command(command: str, env: dict[str, str], stdin: bytes | None = None) -> str:
    """Run `command` in a process group of its own, which ends with it: every process it started
    is killed when it exits, when the episode is cancelled (its timeout), and, through the guard's
    watchdog (`guarded_shell`), when this process dies (a Ray worker force-killed after its grace)."""
    # Its input is a file, not a pipe: a process it left running would hold a pipe open, and
    # writing more than the pipe holds would wait for it (its output: `collecting`).
    with tempfile.TemporaryFile() as input_, guarded_shell(command) as (argv, lifeline):
        input_.write(stdin or b"")
        input_.seek(0)
        async with collecting(
            argv, stdin=input_, env={**os.environ, **env}, start_new_session=True, pass_fds=[lifeline]
        ) as child:
            try:
                await child.wait()
            finally:  # ended, failed or cancelled (the timeout): the whole command tree goes
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                await child.wait()
            output = await child.output()  # cut: a process that left the group holds it (the tail is lost)
    stdout, stderr = output.stdout.decode(errors="replace"), output.stderr.decode(errors="replace")
    if child.returncode != 0:
        raise AgentCommandError(f"{command!r} exited with {child.returncode}: {stderr[-500:]}")
    return stdout


def episode_env(session: Session, sample: Sample) -> dict[str, str]:
    return {
        "OPENAI_BASE_URL": session.base_url,
        "OPENAI_API_KEY": session.api_key,
        "SLIMEISH_PROMPT": json.dumps(sample.prompt),
        "SLIMEISH_LABEL": json.dumps(sample.label),
    }


async def command_outcome(command: str, verifier: str | None, env: dict[str, str]) -> tuple[str, float]:
    """Run the agent command (and the verifier when the agent prints no reward): its stdout and reward."""
    stdout = await run_command(command, env)
    reward = parse_reward(stdout)
    if reward is None and verifier:
        reward = parse_reward(await run_command(verifier, env, stdin=stdout.encode()))
    if reward is None:
        raise AgentCommandError('no reward: the last stdout line must be a JSON object like {"reward": 1.0}')
    return stdout, reward


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    if not args.agent_command:
        raise ValueError("slimeish.rollout_functions.agent_command needs --agent-command")

    workers = workers_of(args)

    async def episode(session: Session, sample: Sample) -> Sample:
        outcome = (args.agent_command, args.verifier_command, episode_env(session, sample))
        if workers is None:
            stdout, reward = await command_outcome(*outcome)
        else:
            (stdout, reward), node_id = await workers.run(command_outcome, *outcome)
            sample.metadata["agent_node_id"] = node_id
        sample.response = stdout
        sample.reward = reward
        sample.status = Status.COMPLETED
        return sample

    return run_episodes(args, data_source, episode, rollout_id=rollout_id, evaluation=evaluation)
