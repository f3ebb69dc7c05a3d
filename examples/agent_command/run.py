"""The agent_command example's one command: train an external agent program on the CPU stack.

    python -m examples.agent_command.run                 # agent prints its own reward
    python -m examples.agent_command.run --verifier      # agent prints its answer, verifier.py scores it

`slimeish train` starts the embedded buffer, a CPU engine with a tiny model, and the router;
`slimeish.rollout_functions.agent_command` runs `agent.py` once per episode against its own router
session. Flags not listed by `--help` go to `slimeish train` unchanged and win (e.g.
`--num-rollout 20`, or `--engine-url URL --weight-sync disk --device cuda` with a real
`--model-path`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from examples.math_sglang.data import MathDataConfig, write_datasets
from slimeish import train
from slimeish.common.config import add_dataclass_args, from_namespace, help_field

HERE = Path(__file__).resolve().parent
TRAIN_ARGS = [
    "--rollout-function-path", "slimeish.rollout_functions.agent_command.generate_rollout",
    "--device", "cpu", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--lr", "1e-5",
    "--rollout-timeout", "120",
]  # fmt: skip


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


def train_argv(cfg: AgentRunConfig, extra: list[str]) -> list[str]:
    run_dir = cfg.run_dir.resolve()
    train_jsonl, _ = write_datasets(run_dir / "data", MathDataConfig(n_train=64, n_eval=1, max_value=9))
    agent, verifier = commands(cfg)
    argv = ["--run-dir", str(run_dir), "--model-path", str(_model_path(cfg, run_dir))]
    argv += ["--prompt-data", str(train_jsonl), "--num-rollout", str(cfg.num_rollout), "--agent-command", agent]
    if verifier is not None:
        argv += ["--verifier-command", verifier]
    return argv + TRAIN_ARGS + extra


def _model_path(cfg: AgentRunConfig, run_dir: Path) -> Path:
    if cfg.model_path is not None:
        return cfg.model_path.resolve()
    from slimeish.models.tiny import ensure_tiny_model

    return ensure_tiny_model(run_dir / "tiny-model")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dataclass_args(parser, AgentRunConfig, "example")
    ns, extra = parser.parse_known_args(argv)
    args = train_argv(from_namespace(AgentRunConfig, ns), extra)
    print("slimeish train " + shlex.join(args), flush=True)
    train.main(args)


if __name__ == "__main__":
    main()
