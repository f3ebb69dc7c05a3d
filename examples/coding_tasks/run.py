"""The coding_tasks example's one command: train a coding agent on Harbor tasks on the CPU stack.

    python -m examples.coding_tasks.run

`slimeish train` starts the embedded buffer, a CPU engine with a tiny model, and the router;
`slimeish.rollout_functions.harness` runs `agent.py` once per episode in a fresh sandbox holding
the task's workspace, and the task's own tests give the reward. Flags not listed by `--help` are
`slimeish train` flags applied over the example's settings, so they win (e.g.
`--agent-command '...'` for another agent program, `--sandbox-bwrap off`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from slimeish import train
from slimeish.common.config import add_dataclass_args, from_namespace, help_field
from slimeish.data import DataConfig, write_prompts
from slimeish.rollout import RolloutConfig
from slimeish.rollout_functions.harness.rollout import HarnessConfig
from slimeish.rollout_functions.harness.tasks import task_records
from slimeish.train import RunConfig, TrainSetup, parse_args
from slimeish.train.setup import command_line
from slimeish.trainer.config import TrainerConfig

HERE = Path(__file__).resolve().parent
TASKS = HERE / "tasks"


@dataclass(kw_only=True)
class CodingRunConfig:
    model_path: Path | None = help_field(None, help="HF checkpoint to train (default: a tiny model in the run dir)")
    run_dir: Path = help_field(Path("runs/coding_tasks"), help="data, logs, metrics and checkpoints")
    tasks: Path = help_field(TASKS, help="folder of Harbor task directories")
    num_rollout: int = help_field(2, help="rollout steps")
    max_tokens: int = help_field(16, help="new tokens per model call (small: the tiny model decodes on CPU)")
    max_turns: int = help_field(2, help="model calls per episode at most")
    agent: Literal["openai", "mini-swe-agent"] = help_field(
        "openai", help="agent.py (openai SDK, a bash tool) or mini-swe-agent (pip install 'slimeish[harness]')"
    )


def agent_command(cfg: CodingRunConfig) -> str:
    if cfg.agent == "mini-swe-agent":  # installed beside this interpreter
        mini = shlex.quote(str(Path(sys.executable).parent / "mini"))
        script = shlex.quote(str(HERE / "mini_swe_agent.sh"))
        return f"MINI={mini} bash {script} {cfg.max_turns} {cfg.max_tokens}"
    python = shlex.quote(sys.executable)  # the interpreter running this example has `openai`
    agent = shlex.quote(str(HERE / "agent.py"))
    return f"{python} {agent} --max-tokens {cfg.max_tokens} --max-turns {cfg.max_turns}"


def train_setup(cfg: CodingRunConfig, extra: list[str]) -> TrainSetup:
    """The run: the tasks as prompts, the model and a short preset, then the user's flags, which win."""
    run_dir = cfg.run_dir.resolve()
    prompts = run_dir / "data" / "tasks.jsonl"
    # mini-swe-agent imports litellm, which alone takes ~10 s of CPU: more than a minute on a loaded 2-core machine
    timeout_multiplier = 5.0 if cfg.agent == "mini-swe-agent" else 1.0
    write_prompts(prompts, task_records(cfg.tasks))
    base = TrainSetup(
        run=RunConfig(run_dir=run_dir, num_rollout=cfg.num_rollout),
        data=DataConfig(prompt_data=prompts, metadata_key="metadata"),
        rollout=RolloutConfig(
            rollout_function_path="slimeish.rollout_functions.harness.generate_rollout",
            rollout_batch_size=2,
            n_samples_per_prompt=2,
            rollout_timeout=60.0 * timeout_multiplier + 60.0,  # the agent's time, then the grader's
        ),
        plugin=HarnessConfig(agent_command=agent_command(cfg), agent_timeout_multiplier=timeout_multiplier),
        trainer=TrainerConfig(model_path=_model_path(cfg, run_dir), device="cpu", lr=1e-5),
    )
    return parse_args(extra, base=base)


def _model_path(cfg: CodingRunConfig, run_dir: Path) -> Path:
    if cfg.model_path is not None:
        return cfg.model_path.resolve()
    from slimeish.models.tiny import ensure_tiny_model

    return ensure_tiny_model(run_dir / "tiny-model")


def main(argv: list[str] | None = None) -> None:
    # no abbreviations: `slimeish train`'s --mode must reach it, not be read as this parser's --model-path
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    add_dataclass_args(parser, CodingRunConfig, "example")
    ns, extra = parser.parse_known_args(argv)
    setup = train_setup(from_namespace(CodingRunConfig, ns), extra)
    print("slimeish train " + shlex.join(command_line(setup)), flush=True)
    train.run(setup)


if __name__ == "__main__":
    main()
