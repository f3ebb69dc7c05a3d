"""The agent_command example's one command: train an external agent program on the CPU stack.

    python -m examples.agent_command.run                 # agent prints its own reward
    python -m examples.agent_command.run --verifier      # agent prints its answer, verifier.py scores it

`slimeish train` starts the embedded buffer, a CPU engine with a tiny model, and the router;
`slimeish.rollout_functions.agent_command` runs `agent.py` once per episode against its own router
session. Flags not listed by `--help` are `slimeish train` flags applied over the example's
settings, so they win (e.g. `--rollout-batch-size 4`, or `--engine-url URL --weight-sync disk
--device cuda` with a real `--model-path`).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from examples.launch import model_or_tiny, run_example
from examples.math_sglang.data import MathDataConfig, write_datasets
from slimeish.common.config import help_field
from slimeish.data import DataConfig
from slimeish.rollout import RolloutConfig
from slimeish.rollout_functions.agent_command import AgentCommandConfig
from slimeish.train import RunConfig, TrainSetup, parse_args
from slimeish.trainer.config import TrainerConfig

HERE = Path(__file__).resolve().parent


def preset(run_dir: Path, prompts: Path, model: Path, num_rollout: int, plugin: AgentCommandConfig) -> TrainSetup:
    """A short CPU run of the agent command on the tiny model's embedded engine."""
    return TrainSetup(
        run=RunConfig(run_dir=run_dir, num_rollout=num_rollout),
        data=DataConfig(prompt_data=prompts),
        rollout=RolloutConfig(
            rollout_function_path="slimeish.rollout_functions.agent_command.generate_rollout",
            rollout_batch_size=2,
            n_samples_per_prompt=2,
            rollout_timeout=120.0,
        ),
        plugin=plugin,
        trainer=TrainerConfig(model_path=model, device="cpu", lr=1e-5),
    )


@dataclass(kw_only=True)
class AgentRunConfig:
    model_path: Path | None = help_field(None, help="HF checkpoint to train (default: a tiny model in the run dir)")
    run_dir: Path = help_field(Path("runs/agent_command"), help="data, logs, metrics and checkpoints")
    num_rollout: int = help_field(2, help="rollout steps")
    max_tokens: int = help_field(16, help="new tokens per agent reply (small: the tiny model decodes on CPU)")
    verifier: bool = help_field(False, help="score with verifier.py (--verifier-command) instead of in the agent")


def commands(cfg: AgentRunConfig) -> tuple[str, str | None]:
    """The agent command line and the verifier's (None: the agent prints its own reward)."""
    python = shlex.quote(sys.executable)  # the interpreter running this example has `openai`
    agent = f"{python} {shlex.quote(str(HERE / 'agent.py'))} --max-tokens {cfg.max_tokens}"
    if not cfg.verifier:
        return agent, None
    return f"{agent} --answer-only", f"{python} {shlex.quote(str(HERE / 'verifier.py'))}"


def train_setup(cfg: AgentRunConfig, extra: list[str]) -> TrainSetup:
    """The run: data, model and the preset, then the user's `slimeish train` flags, which win."""
    run_dir = cfg.run_dir.resolve()
    train_jsonl, _ = write_datasets(run_dir / "data", MathDataConfig(n_train=64, n_eval=1, max_value=9))
    agent, verifier = commands(cfg)
    plugin = AgentCommandConfig(agent_command=agent, verifier_command=verifier)
    base = preset(run_dir, train_jsonl, model_or_tiny(cfg.model_path, run_dir), cfg.num_rollout, plugin)
    return parse_args(extra, base=base)


def main(argv: list[str] | None = None) -> None:
    run_example(AgentRunConfig, train_setup, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    main()
