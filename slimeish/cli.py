"""The `slimeish` command: one subcommand per part, each owned by the module that implements it.

Subcommands are imported lazily so `slimeish --help` and light commands do not pay for torch or
megatron imports. Each target is `module:function` taking the remaining argv.
"""

from __future__ import annotations

import importlib
import sys

# name -> (entry point "module:function(argv)", one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "make-tiny-model": ("slimeish.models.tiny:main", "write a tiny HF-format causal LM + tokenizer"),
    "engine": ("slimeish.engine.server:main", "serve a model with the embedded SGLang-protocol engine"),
    "buffer": ("slimeish.buffer.cli:main", "run or inspect the Redis data buffer (serve, stats, export)"),
    "router": ("slimeish.router.server:main", "run the OpenAI-compatible token-logging router"),
    "train": ("slimeish.train:main", "launch an RL run: buffer, engines, router, trainer"),
    "viewer": ("slimeish.viewer.server:main", "serve the read-only web viewer of runs, steps and samples"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: slimeish COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `slimeish COMMAND --help` for the flags of one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"slimeish: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        raise SystemExit(2)
    module_name, func_name = COMMANDS[name][0].split(":")
    getattr(importlib.import_module(module_name), func_name)(rest)
