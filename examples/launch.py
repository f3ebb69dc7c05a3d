"""What every example's one command shares: its model, and parsing its own flags before `slimeish train`'s.

An example's `run.py` defines its flags as a dataclass and a `train_setup(cfg, extra)` that builds
its preset and applies the user's remaining `slimeish train` flags over it; `run_example` parses,
prints the equivalent `slimeish train` command line and runs it.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from slimeish import train
from slimeish.common.config import add_dataclass_args, from_namespace
from slimeish.train import TrainSetup
from slimeish.train.setup import command_line

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")


def model_or_tiny(model_path: Path | None, run_dir: Path) -> Path:
    """The checkpoint the user gave, else a tiny random model built once in the run dir."""
    if model_path is not None:
        return model_path.resolve()
    from slimeish.models.tiny import ensure_tiny_model  # builds a tokenizer: only when it is needed

    return ensure_tiny_model(run_dir / "tiny-model")


def run_example(
    config_type: type[C],
    train_setup: Callable[[C, list[str]], TrainSetup],
    description: str,
    argv: list[str] | None = None,
    check: Callable[[C], None] | None = None,
) -> None:
    """Parse the example's flags (the rest are `slimeish train`'s), `check` them, then train."""
    # no abbreviations: `slimeish train`'s flags (--mode) must reach it, not be read as the example's (--model-path)
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False)
    add_dataclass_args(parser, config_type, "example")
    ns, extra = parser.parse_known_args(argv)
    cfg = from_namespace(config_type, ns)
    if check is not None:
        check(cfg)
    setup = train_setup(cfg, extra)
    print("slimeish train " + shlex.join(command_line(setup)), flush=True)
    train.run(setup)
